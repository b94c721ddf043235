"""What a user defines: a view (its id, target table, key, as_of, input) and how a replica runs it.

Two inputs feed a view, both deterministic across replicas (same source, same times, same rows):

* :class:`ChangesInput`: a source Delta table's change data feed. Time = the source commit version,
  diff from the change type. An optional ``map_row`` (filter, project, map one row) runs on each
  changed row and keeps its time and diff; a row it fails on becomes an error update.
* :class:`SnapshotInput`: ``query(source_df)`` over the source read at a pinned version ``t``, for
  every source version ``t``; a view over a snapshot changes only where consecutive snapshots
  differ (a keyed anti-join).

A view definition can also be loaded from YAML (see README), functions named as
``module:function``.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Union

import yaml
from pyspark.sql import DataFrame
from pyspark.sql import types as T


class ConfigError(ValueError):
    """A view definition or the tables it names cannot be used; nothing has been written."""


@dataclass(frozen=True)
class ChangesInput:
    """The change data feed of the Delta table at ``source`` (it must have CDF enabled)."""

    source: str
    map_row: Callable[[dict], dict | None] | None = None
    #: The schema of what ``map_row`` returns (DDL string or StructType); required with map_row.
    output_schema: str | T.StructType | None = None

    def __post_init__(self):
        if self.map_row is not None and self.output_schema is None:
            raise ConfigError("ChangesInput: map_row needs output_schema (what the function returns)")


@dataclass(frozen=True)
class SnapshotInput:
    """``query`` applied to the Delta table at ``source`` read at each of its versions."""

    source: str
    query: Callable[[DataFrame], DataFrame]


Input = Union[ChangesInput, SnapshotInput]


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ViewDefinition:
    view_id: str
    target: str
    input: Input
    #: Key columns (used for partitioning, the anti-join and key checks); empty: the whole row.
    key: tuple[str, ...] = ()
    #: The first time the view writes; the table holds nothing before it.
    as_of: int = 0
    read_only: bool = False
    replica_id: str = field(default_factory=default_replica_id)

    def __post_init__(self):
        if not self.view_id or any(c in self.view_id for c in "/\\ "):
            raise ConfigError(f"view_id {self.view_id!r} must be non-empty without '/', '\\' or spaces")
        if not isinstance(self.as_of, int) or self.as_of < 0:
            raise ConfigError(f"as_of must be a non-negative integer, not {self.as_of!r}")
        object.__setattr__(self, "key", tuple(self.key))
        object.__setattr__(self, "target", normalize_path(self.target))
        source = normalize_path(self.input.source)
        object.__setattr__(self, "input", replace(self.input, source=source))

    @property
    def app_id(self) -> str:
        """The Delta ``txn`` appId whose version is this view's upper; shared by all replicas."""
        return f"mvsink:{self.view_id}"


def normalize_path(path: str) -> str:
    """Absolute local paths stay plain; URIs (s3://, file://) are kept as they are."""
    if "://" in path:
        return path.rstrip("/")
    return str(Path(path).expanduser().absolute())


def resolve_function(spec: str, base_dir: Path | None = None) -> Callable:
    """``package.module:function`` (or ``path/to/file.py:function``) to the function."""
    if ":" not in spec:
        raise ConfigError(f"function {spec!r} must be given as module:function")
    module_name, func_name = spec.rsplit(":", 1)
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        sys.path.insert(0, str(path.parent.absolute()))
        module_name = path.stem
    elif base_dir is not None and str(base_dir) not in sys.path:
        sys.path.insert(0, str(base_dir))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r} for {spec!r}: {exc}") from exc
    try:
        return getattr(module, func_name)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no function {func_name!r}") from None


def load_config(path: str | os.PathLike, *, read_only: bool | None = None,
                replica_id: str | None = None) -> ViewDefinition:
    """A view definition from a YAML file; command-line flags override the file."""
    spec = spec_from_yaml(path)
    return view_from_spec(
        spec,
        read_only=bool(spec.get("read_only", False)) if read_only is None else read_only,
        replica_id=replica_id or spec.get("replica_id") or default_replica_id(),
    )


_SETTINGS = {"view_id", "target", "key", "as_of", "input", "read_only", "replica_id"}


def spec_from_yaml(path: str | os.PathLike) -> dict:
    """The view specification in a YAML file, relative paths made absolute (``base_dir``).

    A specification is plain data (it travels in ``CreateDataflow``): view_id, target, key, as_of,
    input (kind, source, map_row, output_schema or query; functions as ``module:function``), and
    ``base_dir``, the directory functions and relative paths are resolved against.
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping")
    unknown = set(raw) - _SETTINGS
    if unknown:
        raise ConfigError(f"{path}: unknown settings {sorted(unknown)}; known: {sorted(_SETTINGS)}")
    base = str(path.parent.absolute())
    spec = {**raw, "base_dir": base}
    for required in ("view_id", "target", "input"):
        if required not in spec:
            raise ConfigError(f"{path}: missing required setting {required!r}")
    return spec


def shared_spec(spec: dict) -> dict:
    """The specification without the settings that belong to one replica (read_only, replica_id):
    what every replica of the view is given in ``CreateDataflow``."""
    return {k: v for k, v in spec.items() if k not in ("read_only", "replica_id")}


def view_from_spec(spec: dict, *, read_only: bool, replica_id: str | None = None) -> ViewDefinition:
    """The view a specification (see :func:`spec_from_yaml`) defines, for one replica."""
    if not isinstance(spec, dict):
        raise ConfigError(f"a view specification must be a mapping, not {spec!r}")
    unknown = set(spec) - _SETTINGS - {"base_dir"}
    if unknown:
        raise ConfigError(f"view specification: unknown settings {sorted(unknown)}")
    for required in ("view_id", "target", "input"):
        if required not in spec:
            raise ConfigError(f"view specification: missing required setting {required!r}")
    base = Path(spec["base_dir"]) if spec.get("base_dir") else None

    def relative(p: str) -> str:
        return p if "://" in p or os.path.isabs(p) or base is None else str(base / p)

    where = f"view {spec['view_id']!r}"
    input_spec = spec["input"]
    if (not isinstance(input_spec, dict) or "source" not in input_spec
            or input_spec.get("kind") not in ("changes", "snapshot")):
        raise ConfigError(f"{where}: input needs kind (changes or snapshot) and source")
    if input_spec["kind"] == "changes":
        fn = input_spec.get("map_row")
        view_input: Input = ChangesInput(
            source=relative(input_spec["source"]),
            map_row=resolve_function(fn, base) if fn else None,
            output_schema=input_spec.get("output_schema"),
        )
    else:
        if "query" not in input_spec:
            raise ConfigError(f"{where}: a snapshot input needs query: module:function")
        view_input = SnapshotInput(source=relative(input_spec["source"]),
                                   query=resolve_function(input_spec["query"], base))
    key = spec.get("key") or ()
    if isinstance(key, str):
        key = (key,)
    try:
        as_of = int(spec.get("as_of", 0))
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: as_of must be an integer, not {spec.get('as_of')!r}") from None
    return ViewDefinition(
        view_id=str(spec["view_id"]),
        target=relative(spec["target"]),
        input=view_input,
        key=tuple(key),
        as_of=as_of,
        read_only=read_only,
        replica_id=replica_id or default_replica_id(),
    )
