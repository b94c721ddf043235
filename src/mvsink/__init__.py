"""mvsink: keep a Delta table exactly equal to a view computed by Spark, across racing replicas."""

from mvsink.read import (NotReadable, ViewInError, read_view, register_temp_view, view_errors,
                         view_since, view_upper)
from mvsink.sink import MaterializedView, StepReport, TimeWentBackwards
from mvsink.timeline import Timeline
from mvsink.view import (ChangesInput, ConfigError, SnapshotInput, ViewDefinition, load_config)

__all__ = [
    "ChangesInput", "ConfigError", "MaterializedView", "NotReadable", "SnapshotInput", "StepReport",
    "Timeline", "TimeWentBackwards", "ViewDefinition", "ViewInError", "load_config", "read_view",
    "register_temp_view", "view_errors", "view_since", "view_upper",
]
