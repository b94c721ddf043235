"""A change-feed view: a source's changes, each at the first time covering its commit.

``snapshot(t)`` is the source at time `t`'s version (diff +1), ``changes(lo, hi)`` its changes
between the versions of `lo - 1` and `hi` (:func:`source_changes`: the change data files or the
added and removed files its commits name, else its change data feed), each change at the first
time whose version covers its commit; rows go through ``map_row`` when given. When neither can
be read for the range (change data feed off for a version with deletion vectors, its
``_change_data`` files removed, a schema change Delta cannot read across), the changes are the
differences of the source's snapshots at each time's version instead: exact, never skipped. A
snapshot that cannot be read either (files VACUUMed), or a column whose type changed under a view
without ``map_row``, stops the view with a :class:`~mvsink.desired.changes.SourceChangesLost` or
:class:`~mvsink.desired.changes.SourceSchemaChanged` naming the versions.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink.desired.changes import (Changes, SourceChangesLost, SourceSchemaChanged, feed_is_small, held_changes,
                                    unreadable)
from mvsink.desired.log_changes import CHANGE_TYPE, LogChangesUnavailable, change_diff, consolidated_rows, log_changes
from mvsink.desired.row_errors import map_rows
from mvsink.desired.sources import Desired
from mvsink.table import spark_uri
from mvsink.timeline import Timeline
from mvsink.updates import DIFF, ERROR, TIME
from mvsink.view import ChangesInput, ConfigError, ViewDefinition

log = logging.getLogger(__name__)

_CDF_COLUMNS = (CHANGE_TYPE, "_commit_version", "_commit_timestamp")
#: The most rows of a rewrite consolidated in this process that one task holds (:func:`changes_are_small`).
ONE_TASK_ROWS = 100_000


def change_feed(spark: SparkSession, path: str, spans: list[tuple[int, int, int]], first: int,
                last: int) -> DataFrame:
    """The change data feed of the Delta table at ``path``, versions ``first`` to ``last``, as
    updates: the table's columns, each change's time (the span ``(time, first version, last
    version)`` holding its commit) and diff (+1 inserted or post-image, -1 deleted or pre-image)."""
    feed = (
        spark.read.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", first).option("endingVersion", last).load(spark_uri(path))
    )
    # Each commit's time, as an expression over the spans (few: one per time), not a join.
    if len(spans) == 1:  # every commit read is in it
        time_of_commit = F.lit(spans[0][0])
    else:
        time_of_commit = F.lit(None)
        for time, first_version, last_version in reversed(spans):
            time_of_commit = F.when(F.col("_commit_version").between(first_version, last_version),
                                    F.lit(time)).otherwise(time_of_commit)
    source_cols = [c for c in feed.columns if c not in _CDF_COLUMNS]
    return feed.select(*source_cols, time_of_commit.cast("long").alias(TIME), change_diff())


def source_changes(spark: SparkSession, path: str, spans: list[tuple[int, int, int]], first: int,
                   last: int) -> DataFrame:
    """The changes of the Delta table at ``path``, versions ``first`` to ``last``, as updates (see
    :func:`change_feed`): from the files the log names (:mod:`mvsink.desired.log_changes`: the
    files the change data feed would read, with the feed on or off, read as plain Parquet); from
    the feed where those files do not hold the table's rows (deletion vectors, a schema change)."""
    try:
        return log_changes(spark, path, spans, feed_is_small(path, first, last))
    except LogChangesUnavailable as exc:
        log.info("source %s: versions %d..%d are read from the change data feed: %s", path, first, last, exc)
    return change_feed(spark, path, spans, first, last)


def changes_are_small(path: str, first: int, last: int) -> bool:
    """Whether the changes of versions ``first`` to ``last`` of the table at ``path`` (as
    :func:`source_changes` read them) are small enough for one task: their files are
    (:func:`~mvsink.desired.changes.feed_is_small`), or they were a rewrite consolidated in this
    process into at most :data:`ONE_TASK_ROWS` rows."""
    rows = consolidated_rows(path, first, last)
    return rows is not None and rows <= ONE_TASK_ROWS or feed_is_small(path, first, last)


class ChangesDesired(Desired):
    def __init__(self, spark: SparkSession, view: ViewDefinition, timeline: Timeline):
        assert isinstance(view.input, ChangesInput)
        self.input: ChangesInput = view.input
        self.source = view.input.source
        self.name = next(n for n, p in view.sources.items() if p == self.source)
        super().__init__(spark, view, timeline)
        if not self._change_feed_enabled(self.name):
            raise ConfigError(
                f"source {self.source} does not have the change data feed enabled; run "
                f"ALTER TABLE delta.`{self.source}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
            )

    def sources_read(self) -> list[str]:
        return [self.name]

    def strategy_description(self) -> str:
        """The strategy the view's changes get, in words (shown by ``mvsink explain``)."""
        mapped = ", each row through its map_row function" if self.input.map_row is not None else ""
        return f"its changes are source {self.name}'s changes (its change data feed, or its commits' files){mapped}"

    def _source_schema(self) -> T.StructType:
        return self.read_source(self.name, self.schema_versions()[self.name]).schema

    def _user_schema(self) -> T.StructType:
        if self.input.map_row is None:
            return self._source_schema()
        schema = self.input.output_schema
        if isinstance(schema, str):
            try:
                schema = T._parse_datatype_string(schema)
            except Exception as exc:
                raise ConfigError(f"output_schema {self.input.output_schema!r} is not valid DDL: {exc}") from None
        return schema

    def _to_view(self, rows: DataFrame) -> DataFrame:
        if self.input.map_row is not None:
            rows = map_rows(rows, self.input.map_row, self.user_schema)
        else:
            rows = rows.withColumn(ERROR, F.lit(None).cast("string"))
        return self._finish(rows)

    def snapshot(self, time: int) -> DataFrame:
        return self._rows_at(self.timeline.versions(time)[self.name], time, 1)

    @property
    def snapshot_is_stored(self) -> bool:
        return self.input.map_row is None

    def changes(self, lo: int, hi: int) -> Changes | None:
        """The change feed between the versions of times `lo - 1` and `hi`; None if none."""
        first = self.timeline.versions(lo - 1)[self.name] + 1
        last = self.timeline.versions(hi)[self.name]
        if first > last:
            return None
        # The times whose entries move this source's version: (time, first version, last version).
        spans, previous = [], first - 1
        for time in range(lo, hi + 1):
            version = self.timeline.versions(time)[self.name]
            if version > previous:
                spans.append((time, previous + 1, version))
                previous = version
        try:
            return replace(held_changes(self._feed_changes(spans, first, last), lo, self.view.key,
                                        one_task=feed_is_small(self.source, first, last)), strategy="change feed")
        except Exception as exc:
            reason = unreadable(exc)
            if reason is None:
                raise
        log.warning("source %s: the changes of versions %d..%d cannot be read (%s); computing "
                    "times %d..%d from snapshots instead", self.source, first, last, reason, lo, hi)
        return replace(self._snapshot_changes(spans, first - 1, reason), strategy="snapshot difference")

    def _feed_changes(self, spans: list[tuple[int, int, int]], first: int, last: int) -> DataFrame:
        return self._to_view(source_changes(self.spark, self.source, spans, first, last))

    def _snapshot_changes(self, spans: list[tuple[int, int, int]], before: int, feed_error: str) -> Changes:
        """The changes at each span's time as the difference of the source's snapshots at the
        span's last version and the version before it (``before`` for the first)."""
        parts, previous = [], before
        for time, _, version in spans:
            parts += [self._rows_at(previous, time, -1), self._rows_at(version, time, 1)]
            previous = version
        updates = reduce(DataFrame.unionByName, parts)
        try:
            return held_changes(updates, spans[0][0], self.view.key)
        except Exception as exc:
            reason = unreadable(exc)
            if reason is None:
                raise
            raise SourceChangesLost(
                f"source {self.name} ({self.source}) of view {self.view.view_id!r}: the changes of versions "
                f"{before + 1}..{spans[-1][2]} cannot be read ({feed_error}), nor the snapshots at those "
                f"versions ({reason}): their files are gone (VACUUM?). The view cannot be exact at times "
                f"{spans[0][0]}..{spans[-1][0]}; nothing was written. To go on, rebuild the target "
                f"(move it away) with as_of {spans[-1][0]}, the first time whose source version is readable") from None

    def _rows_at(self, version: int, time: int, diff: int) -> DataFrame:
        """The source at ``version`` as the view's updates at ``time`` with ``diff``."""
        source = self.read_source(self.name, version)
        if self.input.map_row is None:
            have = {f.name: f.dataType for f in source.schema.fields}
            changed = [f"{f.name} {f.dataType.simpleString()} -> "
                       f"{have[f.name].simpleString() if f.name in have else 'dropped'}"
                       for f in self.user_schema.fields if have.get(f.name) != f.dataType]
            if changed:
                raise SourceSchemaChanged(
                    f"source {self.name} ({self.source}) of view {self.view.view_id!r} changed columns at "
                    f"version {version}: {', '.join(changed)}; the view's columns are fixed, nothing was "
                    "written. Define the view with map_row and output_schema, or a new view")
        return self._to_view(source.select(
            *source.columns, F.lit(time).cast("long").alias(TIME), F.lit(diff).cast("long").alias(DIFF)))
