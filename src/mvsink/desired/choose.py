"""Which input a view gets: its change feed for a change-feed view, else its query; and why.

:func:`strategy` says, for one view definition, which strategy its changes get and why (what stops
its query from being maintained, the join keys the other sides are pruned by), reading its sources'
schemas only: it writes nothing, not even the timeline.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from mvsink.desired.change_feed import ChangesDesired
from mvsink.desired.snapshot import SnapshotDesired
from mvsink.desired.sources import Desired
from mvsink.timeline import Timeline
from mvsink.view import ChangesInput, SnapshotInput, ViewDefinition


def desired_for(spark: SparkSession, view: ViewDefinition, timeline: Timeline) -> Desired:
    if isinstance(view.input, ChangesInput):
        return ChangesDesired(spark, view, timeline)
    return SnapshotDesired(spark, view, timeline)


def strategy(spark: SparkSession, view: ViewDefinition) -> str:
    """How ``view``'s changes are computed and why, in words (refused as the job would refuse it:
    a :class:`~mvsink.view.ConfigError`)."""
    return desired_for(spark, view, Timeline(view.timeline, view.sources, view.replica_id)).strategy_description()


def explain(spark: SparkSession, view: ViewDefinition) -> str:
    """``view``'s strategy in words: its sources, key, target, refresh policy and :func:`strategy`."""
    key = f"key ({', '.join(view.key)})" if view.key else "no key (the whole row)"
    refresh = f", refresh {view.input.refresh}" if isinstance(view.input, SnapshotInput) else ""
    return "\n".join([f"view {view.view_id}: {key} -> {view.target}{refresh}",
                      *[f"  source {name}: {path}" for name, path in view.sources.items()],
                      f"  {strategy(spark, view)}"])
