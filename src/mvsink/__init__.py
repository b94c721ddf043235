"""mvsink: keep a Delta table exactly equal to a view computed by Spark, across racing replicas.

The names below are imported from their modules when first used: a process that needs one module
(a Spark Python worker running a task of :mod:`mvsink.desired.key_check`, say) imports only that one."""

from __future__ import annotations

import importlib

_HOMES = {
    "mvsink.target.read": ("NotReadable", "ViewInError", "read_view", "register_temp_view", "version_of_time", "view_errors",
                    "view_since", "view_upper"),
    "mvsink.sink": ("MaterializedView", "StepReport", "TimeWentBackwards"),
    "mvsink.timeline": ("Timeline",),
    "mvsink.view": ("ChangesInput", "ConfigError", "SnapshotInput", "ViewDefinition", "load_config"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'mvsink' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
