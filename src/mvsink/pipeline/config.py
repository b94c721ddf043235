"""``pipeline.yaml`` and the SQL files beside it: which views, where they read, where they go.

The YAML names the sources (name -> Delta path), the target root (a view's target is
``<targets>/<view name>`` unless ``views.<name>.target`` says otherwise), the timeline (default
``<targets>/_timeline``) and defaults for every view (``retain_history``, ``layout``, ``as_of``,
``trigger_seconds``, ``adopt``: take over an existing Delta target, see
:mod:`mvsink.target.ownership`); ``views.<name>`` may override them per view. The views are the
``CREATE MATERIALIZED VIEW`` statements of every ``*.sql`` file under the folder and the functions
decorated with ``@materialized_view`` in every ``*.py`` file under it
(:mod:`mvsink.pipeline.decorator`; importing them runs no Spark job).

Invariants (checked here, without Spark): view names are unique, SQL and Python alike (case-insensitively, as Spark's
names are) and none is a source's name; no two views share a target, and no target is a source or
the timeline; every per-view setting names a view. Relative paths are relative to the YAML file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mvsink.pipeline.decorator import PythonView, python_views
from mvsink.pipeline.parse import PipelineError, ViewStatement, parse_file
from mvsink.view import ConfigError, normalize_path, yaml_mapping

CONFIG_FILE = "pipeline.yaml"
_SETTINGS = {"sources", "targets", "timeline", "defaults", "views"}
#: What ``defaults`` and ``views.<name>`` may set; ``target`` only per view.
VIEW_SETTINGS = {"retain_history", "layout", "as_of", "adopt", "deletion_vectors"}
_DEFAULTS = VIEW_SETTINGS | {"trigger_seconds"}


@dataclass(frozen=True)
class PipelineConfig:
    path: Path
    sources: dict[str, str]
    timeline: str
    #: view name -> its SQL statement or Python function, in file order (SQL files first).
    views: dict[str, ViewStatement | PythonView]
    targets: dict[str, str]
    #: view name -> its settings (``retain_history``, ``layout``, ``as_of``, ``adopt``), defaults applied.
    settings: dict[str, dict]
    trigger_seconds: float | None


def config_path(path: str | os.PathLike) -> Path:
    """The pipeline's YAML file: ``path`` itself, or ``pipeline.yaml`` in the folder ``path``."""
    path = Path(path)
    return path / CONFIG_FILE if path.is_dir() else path


def read_config(path: str | os.PathLike) -> PipelineConfig:
    """The pipeline at ``path`` (a folder or its YAML file), checked as the module doc says."""
    path = config_path(path)
    try:
        raw = yaml_mapping(path, _SETTINGS, "pipeline file")
    except ConfigError as exc:
        raise PipelineError(str(exc)) from None
    base = path.parent.absolute()

    def absolute(p) -> str:
        if not isinstance(p, str):
            raise PipelineError(f"{path}: a path must be text, not {p!r}")
        return normalize_path(p if "://" in p or os.path.isabs(p) else str(base / p))

    sources = raw.get("sources")
    if not isinstance(sources, dict) or not sources:
        raise PipelineError(f"{path}: sources must map names to Delta table paths")
    sources = {str(name): absolute(p) for name, p in sources.items()}
    if "targets" not in raw:
        raise PipelineError(f"{path}: missing targets (the folder the views' tables go in)")
    root = absolute(raw["targets"])
    timeline = absolute(raw.get("timeline") or f"{root}/_timeline")
    defaults = _mapping(raw, "defaults", path)
    if unknown := set(defaults) - _DEFAULTS:
        raise PipelineError(f"{path}: unknown defaults {sorted(unknown)}; known: {sorted(_DEFAULTS)}")
    per_view = _mapping(raw, "views", path)

    views: dict[str, ViewStatement | PythonView] = {}
    files = sorted(p for p in path.parent.rglob("*.sql") if p.is_file())
    lowered = {name.lower(): name for name in sources}
    for view in [v for file in files for v in parse_file(file)] + python_views(path.parent):
        same = lowered.get(view.name.lower())
        if same in sources:
            raise PipelineError(f"{view.where}: view {view.name} has the name of source {same}")
        if same is not None:
            raise PipelineError(f"{view.where}: view {view.name} is defined twice; "
                                f"first at {views[same].where}")
        lowered[view.name.lower()] = view.name
        views[view.name] = view
    if not views:
        raise PipelineError(f"{path}: no CREATE MATERIALIZED VIEW statement in any .sql file and no "
                            f"@materialized_view in any .py file under {path.parent}")

    targets, settings = {}, {}
    for name in per_view:
        if name not in views:
            raise PipelineError(f"{path}: views.{name}: no view {name!r} is defined (views: {sorted(views)})")
    for name in views:
        own = per_view.get(name) or {}
        if not isinstance(own, dict) or (unknown := set(own) - VIEW_SETTINGS - {"target"}):
            raise PipelineError(f"{path}: views.{name} may set {sorted(VIEW_SETTINGS | {'target'})}, not {own!r}")
        targets[name] = absolute(own["target"]) if "target" in own else f"{root}/{name}"
        settings[name] = {k: v for k, v in {**defaults, **own}.items() if k in VIEW_SETTINGS}
    _check_targets(path, views, targets, sources, timeline)
    trigger = defaults.get("trigger_seconds")
    if trigger is not None and (isinstance(trigger, bool) or not isinstance(trigger, (int, float)) or not trigger > 0):
        raise PipelineError(f"{path}: defaults.trigger_seconds must be a positive number of seconds, not {trigger!r}")
    return PipelineConfig(path, sources, timeline, views, targets, settings,
                          float(trigger) if trigger is not None else None)


def _mapping(raw: dict, name: str, path: Path) -> dict:
    value = raw.get(name) or {}
    if not isinstance(value, dict):
        raise PipelineError(f"{path}: {name} must be a mapping, not {value!r}")
    return value


def _check_targets(path: Path, views: dict[str, ViewStatement | PythonView], targets: dict[str, str],
                   sources: dict[str, str], timeline: str) -> None:
    owner: dict[str, str] = {}
    for name, target in targets.items():
        where = views[name].where
        if target in owner:
            raise PipelineError(f"{where}: views {owner[target]} ({views[owner[target]].where}) and "
                                f"{name} have one target {target}; give one of them views.<name>.target in {path}")
        if target in sources.values() or target == timeline:
            raise PipelineError(f"{where}: the target {target} of view {name} is a source or the timeline")
        owner[target] = name
