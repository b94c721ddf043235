"""Which input a view gets: its change feed for a change-feed view, else its query."""

from __future__ import annotations

from pyspark.sql import SparkSession

from mvsink.desired.change_feed import ChangesDesired
from mvsink.desired.snapshot import SnapshotDesired
from mvsink.desired.sources import Desired
from mvsink.timeline import Timeline
from mvsink.view import ChangesInput, ViewDefinition


def desired_for(spark: SparkSession, view: ViewDefinition, timeline: Timeline) -> Desired:
    if isinstance(view.input, ChangesInput):
        return ChangesDesired(spark, view, timeline)
    return SnapshotDesired(spark, view, timeline)
