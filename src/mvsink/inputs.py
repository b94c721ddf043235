"""The desired side: a view's input as updates `(row, time, diff)` at the timeline's times.

Both inputs read their sources at the versions the timeline pins for each time
(:mod:`mvsink.timeline`), never "whatever is there now", so every replica computes the same
updates at the same times:

* :class:`ChangesDesired`: ``snapshot(t)`` is the source at time `t`'s version (diff +1),
  ``changes(lo, hi)`` its change data feed between the versions of `lo - 1` and `hi`, each change
  at the first time whose version covers its commit; rows go through ``map_row`` when given.
  When the feed cannot be read for the range (change data feed off for some version, its
  ``_change_data`` files removed, a schema change Delta cannot read across), the changes are the
  differences of the source's snapshots at each time's version instead: exact, never skipped.
  A snapshot that cannot be read either (files VACUUMed), or a column whose type changed under
  a view without ``map_row``, stops the view with a :class:`SourceChangesLost` or
  :class:`SourceSchemaChanged` naming the versions.
* :class:`SnapshotDesired`: ``snapshot(t)`` is the query over the sources at time `t`'s versions;
  ``changes(lo, hi)`` evaluates it once per time whose versions differ from the time before
  (a time that repeats them, a repair time, has no changes) and emits where consecutive results
  differ: the new result at +1 and the last at -1, consolidated (each distinct row's count
  difference, exactly a multiset difference both ways, in one shuffle). It keeps the last result
  in Spark (a local checkpoint, which spills to disk), never on the driver. SQL runs in a session of the view's own, where the
  sources are registered under their names, so views never see each other's sources.

Both add row-level errors (:mod:`mvsink.row_errors`). Source versions come from listing their
``_delta_log`` (:mod:`mvsink.table`), which needs no Spark job.
"""

from __future__ import annotations

import logging

from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink.row_errors import map_rows, null_key_errors
from mvsink.table import latest_version, spark_uri
from mvsink.timeline import Timeline
from mvsink.updates import DIFF, ERROR, TIME, consolidate, table_schema
from mvsink.view import ChangesInput, ConfigError, SnapshotInput, ViewDefinition

log = logging.getLogger(__name__)

_CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")

#: Error conditions of a change feed (or snapshot) read that no retry can cure.
_UNREADABLE = ("DELTA_MISSING_CHANGE_DATA", "FILE_NOT_EXIST", "FileNotFoundException", "DATA_TYPE_MISMATCH",
               "INCOMPATIBLE_SCHEMA_CHANGE", "DELTA_CHANGE_DATA_FEED")


class SourceChangesLost(ConfigError):
    """Neither the change feed nor the snapshots of a range of source versions can be read."""


class SourceSchemaChanged(ConfigError):
    """A source's columns changed so that the view's rows cannot be computed with its schema."""


def _unreadable(exc: Exception) -> str | None:
    """The first line of ``exc`` if it says the data is gone or unreadable for good, else None."""
    text = str(exc)
    if not any(marker in text for marker in _UNREADABLE):
        return None
    start = text.find("[")
    return text[start if start >= 0 else 0:].splitlines()[0][:300]


class Desired:
    """Common part: the sources, the timeline, the view's schema and row-level errors."""

    def __init__(self, spark: SparkSession, view: ViewDefinition, timeline: Timeline):
        self.spark = spark
        self.view = view
        self.timeline = timeline
        self.sources = dict(view.sources)
        for name, path in self.sources.items():
            if latest_version(path) is None:
                raise ConfigError(f"source {name} ({path}) of view {view.view_id!r} is not a Delta table")
        timeline.check_not_behind(self.latest_versions())
        self.user_schema = self._user_schema()
        missing = [k for k in view.key if k not in self.user_schema.names]
        if missing:
            raise ConfigError(f"key columns {missing} are not columns of view {view.view_id!r}: "
                              f"{self.user_schema.names}")
        try:
            self.schema = table_schema(self.user_schema)
        except ValueError as exc:
            raise ConfigError(f"view {view.view_id!r}: {exc}") from None

    def latest_versions(self) -> dict[str, int]:
        """Every source's newest version."""
        versions = {}
        for name, path in self.sources.items():
            version = latest_version(path)
            if version is None:
                raise ConfigError(f"source {name} ({path}) of view {self.view.view_id!r} has disappeared")
            versions[name] = version
        return versions

    def schema_versions(self) -> dict[str, int]:
        """The versions the view's schema is taken from: the latest time's, else the newest."""
        last = self.timeline.last()
        return dict(last.versions) if last is not None else self.latest_versions()

    def read_source(self, name: str, version: int, spark: SparkSession | None = None) -> DataFrame:
        reader = (spark or self.spark).read.format("delta").option("versionAsOf", version)
        return reader.load(spark_uri(self.sources[name]))

    def _finish(self, updates: DataFrame) -> DataFrame:
        """Updates in the table schema, with null-key rows turned into errors."""
        return null_key_errors(updates, self.view.key).select(*self.schema.names)

    def _user_schema(self) -> T.StructType:
        raise NotImplementedError

    def snapshot(self, time: int) -> DataFrame:
        raise NotImplementedError

    @property
    def snapshot_is_stored(self) -> bool:
        """Whether reading a :meth:`snapshot` again only reads stored rows (a pinned Delta
        version, a checkpoint) and runs no user code: it may then be read twice instead of kept."""
        raise NotImplementedError

    def changes(self, lo: int, hi: int) -> DataFrame | None:
        """The updates at times `[lo, hi]`, materialized (a failed read shows here, not later)."""
        raise NotImplementedError


class ChangesDesired(Desired):
    def __init__(self, spark: SparkSession, view: ViewDefinition, timeline: Timeline):
        assert isinstance(view.input, ChangesInput)
        self.input: ChangesInput = view.input
        self.source = view.input.source
        self.name = next(n for n, p in view.sources.items() if p == self.source)
        super().__init__(spark, view, timeline)
        properties = self._source_properties()
        if properties.get("delta.enableChangeDataFeed", "false").lower() != "true":
            raise ConfigError(
                f"source {self.source} does not have the change data feed enabled; run "
                f"ALTER TABLE delta.`{self.source}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
            )

    def _source_properties(self) -> dict[str, str]:
        rows = self.spark.sql(f"SHOW TBLPROPERTIES delta.`{spark_uri(self.source)}`").collect()
        return {r.key: r.value for r in rows}

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

    def changes(self, lo: int, hi: int) -> DataFrame | None:
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
            return self._feed_changes(spans, first, last).localCheckpoint(eager=True)
        except Exception as exc:
            reason = _unreadable(exc)
            if reason is None:
                raise
        log.warning("source %s: the change data feed of versions %d..%d cannot be read (%s); computing "
                    "times %d..%d from snapshots instead", self.source, first, last, reason, lo, hi)
        return self._snapshot_changes(spans, first - 1, reason)

    def _feed_changes(self, spans: list[tuple[int, int, int]], first: int, last: int) -> DataFrame:
        feed = (
            self.spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", first).option("endingVersion", last).load(spark_uri(self.source))
        )
        # Each commit's time, as an expression over the spans (few: one per time), not a join.
        time_of_commit = F.lit(None).cast("long")
        for time, first_version, last_version in reversed(spans):
            time_of_commit = F.when(F.col("_commit_version").between(first_version, last_version),
                                    F.lit(time)).otherwise(time_of_commit)
        diff = (
            F.when(F.col("_change_type").isin("insert", "update_postimage"), F.lit(1))
            .when(F.col("_change_type").isin("delete", "update_preimage"), F.lit(-1))
        )
        source_cols = [c for c in feed.columns if c not in _CDF_COLUMNS]
        updates = feed.select(
            *source_cols, time_of_commit.cast("long").alias(TIME), diff.cast("long").alias(DIFF)
        )
        return self._to_view(updates)

    def _snapshot_changes(self, spans: list[tuple[int, int, int]], before: int, feed_error: str) -> DataFrame:
        """The changes at each span's time as the difference of the source's snapshots at the
        span's last version and the version before it (``before`` for the first)."""
        parts, previous = [], before
        for time, _, version in spans:
            parts += [self._rows_at(previous, time, -1), self._rows_at(version, time, 1)]
            previous = version
        updates = parts[0]
        for part in parts[1:]:
            updates = updates.unionByName(part)
        try:
            return updates.localCheckpoint(eager=True)
        except Exception as exc:
            reason = _unreadable(exc)
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


class SnapshotDesired(Desired):
    def __init__(self, spark: SparkSession, view: ViewDefinition, timeline: Timeline):
        assert isinstance(view.input, SnapshotInput)
        self.input: SnapshotInput = view.input
        self._previous: DataFrame | None = None
        self._previous_time: int | None = None
        self._sql_session: SparkSession | None = None
        super().__init__(spark, view, timeline)

    def _contents(self, versions: dict[str, int]) -> DataFrame:
        where = f"view {self.view.view_id!r}"
        try:
            if self.input.sql is not None:
                if self._sql_session is None:
                    self._sql_session = self.spark.newSession()
                for name in self.sources:
                    self.read_source(name, versions[name], self._sql_session).createOrReplaceTempView(name)
                result = self._sql_session.sql(self.input.sql)
            elif self.input.source is not None:
                (name,) = self.sources  # one unnamed source: the function takes it alone
                result = self.input.query(self.read_source(name, versions[name]))
            else:
                result = self.input.query(**{n: self.read_source(n, versions[n]) for n in self.sources})
        except ParseException as exc:
            raise ConfigError(f"{where}: its SQL does not parse: {_first_line(exc)}") from None
        except AnalysisException as exc:
            message = _first_line(exc)
            if "TABLE_OR_VIEW_NOT_FOUND" in message:
                raise ConfigError(f"{where}: its query reads a table that is not one of its sources "
                                  f"{sorted(self.sources)}: {message}") from None
            raise ConfigError(f"{where}: its query cannot be analyzed: {message}") from None
        except TypeError as exc:
            raise ConfigError(f"{where}: its query function cannot be called with the sources "
                              f"{sorted(self.sources)} by name: {exc}") from None
        if not isinstance(result, DataFrame):
            raise ConfigError(f"query of {where} returned {type(result).__name__}, not a DataFrame")
        return result

    def _user_schema(self) -> T.StructType:
        return self._contents(self.schema_versions()).schema

    def _remember(self, time: int, contents: DataFrame) -> None:
        self._previous = contents.localCheckpoint(eager=True)
        self._previous_time = time

    def _as_updates(self, rows: DataFrame, time: int, diff: int) -> DataFrame:
        return rows.select(
            *self.user_schema.names, F.lit(None).cast("string").alias(ERROR),
            F.lit(time).cast("long").alias(TIME), F.lit(diff).cast("long").alias(DIFF),
        )

    def snapshot(self, time: int) -> DataFrame:
        self._remember(time, self._contents(self.timeline.versions(time)).select(*self.user_schema.names))
        return self._finish(self._as_updates(self._previous, time, 1))

    @property
    def snapshot_is_stored(self) -> bool:
        return True  # the query's result is checkpointed (_remember)

    def changes(self, lo: int, hi: int) -> DataFrame | None:
        """One evaluation per time in `[lo, hi]` whose versions differ from the time before."""
        if self._previous_time is None or self._previous_time >= lo:
            raise RuntimeError(f"snapshot input asked for changes from {lo} after evaluating "
                               f"{self._previous_time}")
        parts = []
        for time in range(lo, hi + 1):
            versions = self.timeline.versions(time)
            if versions == self.timeline.versions(self._previous_time):
                continue
            previous = self._previous
            self._remember(time, self._contents(versions).select(*self.user_schema.names))
            both = self._as_updates(self._previous, time, 1).unionByName(self._as_updates(previous, time, -1))
            parts.append(consolidate(both))
        if not parts:
            return None
        updates = parts[0]
        for part in parts[1:]:
            updates = updates.unionByName(part)
        return self._finish(updates).localCheckpoint(eager=True)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def desired_for(spark: SparkSession, view: ViewDefinition, timeline: Timeline) -> Desired:
    if isinstance(view.input, ChangesInput):
        return ChangesDesired(spark, view, timeline)
    return SnapshotDesired(spark, view, timeline)
