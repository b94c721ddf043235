"""What a user defines: a view (its id, target table, key, as_of, sources, input, timeline).

A view reads named Delta *sources* and lives on a *timeline* (:mod:`mvsink.timeline`): a logical
time is an entry of the timeline, which pins a version of every source. Two inputs feed a view,
both deterministic across replicas (same sources, same times, same rows):

* :class:`ChangesInput`: one source's change data feed; an update's time is the timeline time whose
  entry first covers its commit version, its diff comes from the change type. An optional
  ``map_row`` (filter, project, map one row) runs on each changed row and keeps its time and diff;
  a row it fails on becomes an error update.
* :class:`SnapshotInput`: a query over the sources read at the versions of each time: Spark SQL
  text (the sources registered under their names) or a Python function given, as DataFrames by
  name, the sources its signature names (all of them if it takes ``**kwargs``; for a view with one
  unnamed source, the source DataFrame alone). A view
  over snapshots changes only where consecutive results differ (a keyed anti-join). The query may
  also read ``views`` (:class:`ViewQuery`, a pipeline's views over views): each computed first,
  in order, over the same sources at the same time and the views before it, and read by its name.

A view definition can also be loaded from YAML (see README), functions named as
``module:function``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import posixpath
import re
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Union

import yaml
from pyspark.sql import DataFrame
from pyspark.sql import types as T


class ConfigError(ValueError):
    """A view definition or the tables it names cannot be used; nothing has been written."""


@dataclass(frozen=True)
class ChangesInput:
    """The change data feed of ``source`` (a path, or the name of one of the view's sources; the
    table must have CDF enabled)."""

    source: str
    map_row: Callable[[dict], dict | None] | None = None
    #: The schema of what ``map_row`` returns (DDL string or StructType); required with map_row.
    output_schema: str | T.StructType | None = None

    def __post_init__(self):
        if self.map_row is not None and self.output_schema is None:
            raise ConfigError("ChangesInput: map_row needs output_schema (what the function returns)")


@dataclass(frozen=True)
class ViewQuery:
    """A view a snapshot query reads by name: ``sql`` text or a ``query`` function over the
    sources and the views before it (by name, as a snapshot input's query)."""

    name: str
    sql: str | None = None
    query: Callable[..., DataFrame] | None = None

    def __post_init__(self):
        if (self.query is None) == (self.sql is None):
            raise ConfigError(f"view {self.name!r} read by a query: give exactly one of query and sql")


@dataclass(frozen=True)
class SnapshotInput:
    """A query over the sources read at each time's versions: ``sql`` text over the sources by
    name, or ``query``, a function given them as DataFrames by name; with ``source`` (one table,
    no ``sources`` in the view) ``query`` is given that one DataFrame."""

    source: str | None = None
    query: Callable[..., DataFrame] | None = None
    sql: str | None = None
    #: How its changes are computed (:mod:`mvsink.desired.refresh`): ``auto``, ``incremental``
    #: (a query that cannot be maintained from its sources' changes is refused) or ``full``.
    refresh: str = "auto"
    #: The views the query reads, in dependency order (see the module doc).
    views: tuple[ViewQuery, ...] = ()

    def __post_init__(self):
        if (self.query is None) == (self.sql is None):
            raise ConfigError("SnapshotInput: give exactly one of query (a function) and sql (text)")
        if self.refresh not in ("auto", "incremental", "full"):
            raise ConfigError(f"SnapshotInput: refresh {self.refresh!r} is not one of auto, incremental, full")


Input = Union[ChangesInput, SnapshotInput]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def source_name(path: str) -> str:
    """The name a view's only source gets when the view names none: its directory's name."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", path.rstrip("/").rsplit("/", 1)[-1]) or "source"
    return name if _NAME.match(name) else f"_{name}"


def sources_named(function: Callable, sources: Mapping[str, DataFrame]) -> dict[str, DataFrame]:
    """The ``sources`` a query function takes by name: those its signature names, or all of them
    if it takes ``**kwargs`` (or its signature cannot be read)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return dict(sources)
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return dict(sources)
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {name: rows for name, rows in sources.items() if name in names}


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
    #: The view's sources, name -> Delta table path; empty: the input's one ``source``, named
    #: after its directory. Every view on one timeline declares the timeline's sources.
    sources: Mapping[str, str] = field(default_factory=dict)
    #: The timeline's Delta table; default: ``<target>_timeline`` (a timeline of its own).
    timeline: str | None = None
    #: How much history the table keeps: a duration (``1h``), a number of times, or ``all``;
    #: None: the default (:mod:`mvsink.append.retention`).
    retain_history: str | int | None = None
    #: The target's layout (:mod:`mvsink.target.layout`): ``table`` or ``updates``; None: the existing
    #: target's, ``table`` for a new one.
    layout: str | None = None
    #: Take over an existing Delta target this view did not write (its rows not in the view are
    #: retracted); without it such a target is refused (:mod:`mvsink.target.ownership`).
    adopt: bool = False
    #: Retractions in the table layout (:mod:`mvsink.write.rewrite`): ``on`` marks the rows deleted
    #: in deletion vectors (the target is created with them allowed), ``off`` rewrites the files
    #: holding them and refuses a target with deletion vectors, ``auto`` follows the target (marks
    #: where it allows deletion vectors; a new target is created without them).
    deletion_vectors: str = "auto"

    def __post_init__(self):
        if not self.view_id or any(c in self.view_id for c in "/\\ "):
            raise ConfigError(f"view_id {self.view_id!r} must be non-empty without '/', '\\' or spaces")
        if not isinstance(self.as_of, int) or self.as_of < 0:
            raise ConfigError(f"as_of must be a non-negative integer, not {self.as_of!r}")
        from mvsink.append.retention import Retention  # the append package imports this module
        from mvsink.target.layout import LAYOUTS

        if self.layout is not None and self.layout not in LAYOUTS:
            raise ConfigError(f"view {self.view_id!r}: layout must be one of {list(LAYOUTS)}, not {self.layout!r}")
        if self.deletion_vectors not in DELETION_VECTORS:
            raise ConfigError(f"view {self.view_id!r}: deletion_vectors must be one of {list(DELETION_VECTORS)}, "
                              f"not {self.deletion_vectors!r}")

        try:
            Retention.parse(self.retain_history)
        except ConfigError as exc:
            raise ConfigError(f"view {self.view_id!r}: {exc}") from None
        object.__setattr__(self, "key", tuple(self.key))
        object.__setattr__(self, "target", normalize_path(self.target))
        sources = {str(name): normalize_path(path) for name, path in dict(self.sources).items()}
        bad = [name for name in sources if not _NAME.match(name)]
        if bad:
            raise ConfigError(f"view {self.view_id!r}: source names {bad} are not SQL identifiers")
        source = self.input.source
        if source is not None:
            if source in sources:
                source = sources[source]
            else:
                source = normalize_path(source)
                if sources and source not in sources.values():
                    raise ConfigError(f"view {self.view_id!r}: input source {self.input.source!r} is "
                                      f"neither a name nor a path of its sources {sorted(sources)}")
                sources = sources or {source_name(source): source}
            object.__setattr__(self, "input", replace(self.input, source=source))
        elif not sources:
            raise ConfigError(f"view {self.view_id!r}: give sources (name: path) or the input's source")
        if isinstance(self.input, ChangesInput) and self.input.source is None:
            raise ConfigError(f"view {self.view_id!r}: a changes input needs source (one of {sorted(sources)})")
        object.__setattr__(self, "sources", sources)
        timeline = normalize_path(self.timeline) if self.timeline else self.target + "_timeline"
        object.__setattr__(self, "timeline", timeline)
        if timeline == self.target or timeline in sources.values():
            raise ConfigError(f"view {self.view_id!r}: the timeline {timeline} cannot be the target or a source")

    @property
    def app_id(self) -> str:
        """The Delta ``txn`` appId whose version is this view's upper; shared by all replicas."""
        return f"mvsink:{self.view_id}"


#: The values of :attr:`ViewDefinition.deletion_vectors`.
DELETION_VECTORS = ("auto", "on", "off")


def normalize_path(path: str) -> str:
    """Absolute local paths stay plain; URIs (s3://, file://) are kept as they are."""
    if "://" in path:
        return path.rstrip("/")
    return str(Path(path).expanduser().absolute())


def location(path: str) -> str:
    """Where ``path`` points, for telling whether two spellings name one table (a timeline's
    sources against a view's): a local path (or ``file://`` URI) resolved to an absolute path
    without ``..`` or symlinks; an ``s3://``/``s3a://`` URI as ``s3://bucket/key``, its key's
    ``.``, ``..`` and repeated ``/`` removed. Definitions keep their paths as written."""
    if path.startswith("file://"):
        path = path[len("file://"):]
    if "://" not in path:
        return os.path.realpath(os.path.expanduser(path))
    scheme, rest = path.split("://", 1)
    scheme = "s3" if scheme.lower() in ("s3", "s3a") else scheme.lower()
    bucket, _, key = rest.partition("/")
    key = posixpath.normpath("/" + key).lstrip("/") if key else ""
    return f"{scheme}://{bucket}/{key}".rstrip("/")


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
        loaded = sys.modules.get(module_name)
        if loaded is not None and Path(getattr(loaded, "__file__", None) or "").resolve() != path.resolve():
            del sys.modules[module_name]  # a file of the same name elsewhere: import this one
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


_SETTINGS = {"view_id", "target", "key", "as_of", "input", "read_only", "replica_id", "sources",
             "timeline", "retain_history", "layout", "adopt", "deletion_vectors"}


def spec_from_yaml(path: str | os.PathLike) -> dict:
    """The view specification in a YAML file, relative paths made absolute (``base_dir``).

    A specification is plain data (it travels in ``CreateDataflow``): view_id, target, key, as_of,
    sources (name: path), timeline (a path), retain_history, layout, adopt, deletion_vectors, input (kind, source, map_row, output_schema, query or
    sql, and views: a list of {name, query or sql}; functions as ``module:function``), and
    ``base_dir``, the directory functions and relative paths are resolved against.
    """
    path = Path(path)
    raw = yaml_mapping(path, _SETTINGS)
    base = str(path.parent.absolute())
    spec = {**raw, "base_dir": base}
    for required in ("view_id", "target", "input"):
        if required not in spec:
            raise ConfigError(f"{path}: missing required setting {required!r}")
    return spec


def yaml_mapping(path: Path, known: set[str], what: str = "config file") -> dict:
    """The mapping YAML file ``path`` holds, whose keys are all ``known`` settings."""
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{what} {path} must hold a mapping")
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"{path}: unknown settings {sorted(unknown)}; known: {sorted(known)}")
    return raw


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
    sources = spec.get("sources") or {}
    if not isinstance(sources, dict) or not all(isinstance(p, str) for p in sources.values()):
        raise ConfigError(f"{where}: sources must map names to table paths, not {sources!r}")
    input_spec = spec["input"]
    if not isinstance(input_spec, dict):
        raise ConfigError(f"{where}: input must be a mapping with kind: changes or snapshot, not {input_spec!r}")
    if input_spec.get("kind") not in ("changes", "snapshot"):
        raise ConfigError(f"{where}: input kind {input_spec.get('kind')!r} is not one of the kinds: changes "
                          "(a source's change feed), snapshot (a query over the sources)")
    source = input_spec.get("source")
    if source is not None and source not in sources:
        source = relative(source)
    if input_spec["kind"] == "changes":
        if source is None:
            raise ConfigError(f"{where}: a changes input needs source")
        fn = input_spec.get("map_row")
        view_input: Input = ChangesInput(
            source=source,
            map_row=resolve_function(fn, base) if fn else None,
            output_schema=input_spec.get("output_schema"),
        )
    else:
        if ("query" in input_spec) == ("sql" in input_spec):
            raise ConfigError(f"{where}: a snapshot input needs query: module:function, or sql: text")
        if source is None and not sources:
            raise ConfigError(f"{where}: a snapshot input needs sources (name: path) or source")
        query = resolve_function(input_spec["query"], base) if "query" in input_spec else None
        views = input_spec.get("views") or []
        if not isinstance(views, list) or not all(isinstance(v, dict) and set(v) in ({"name", "sql"}, {"name", "query"})
                                                  for v in views):
            raise ConfigError(f"{where}: input views must be a list of {{name, query or sql}}, not {views!r}")
        view_input = SnapshotInput(source=None if sources else source, query=query,
                                   sql=input_spec.get("sql"), refresh=input_spec.get("refresh", "auto"),
                                   views=tuple(ViewQuery(v["name"], sql=v.get("sql"), query=resolve_function(
                                       v["query"], base) if "query" in v else None) for v in views))
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
        sources={name: relative(path) for name, path in sources.items()},
        timeline=relative(spec["timeline"]) if spec.get("timeline") else None,
        retain_history=spec.get("retain_history"),
        layout=spec.get("layout"),
        adopt=_flag(spec.get("adopt", False), f"{where}: adopt"),
        deletion_vectors=_deletion_vectors_setting(spec.get("deletion_vectors", "auto")),
    )


def _deletion_vectors_setting(value) -> object:
    """YAML reads ``on``/``off`` as booleans: as the words they were."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


def _flag(value, what: str) -> bool:
    """A YAML yes/no setting: true or false, nothing else."""
    if not isinstance(value, bool):
        raise ConfigError(f"{what} must be true or false, not {value!r}")
    return value
