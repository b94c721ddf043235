"""The desired side: a view's input as updates `(row, time, diff)` with time = source version.

Both inputs read the source at pinned versions, never "whatever is there now", so every replica
computes the same updates at the same times:

* :class:`ChangesDesired`: ``snapshot(t)`` is the source at version `t` (diff +1), ``changes(lo,
  hi)`` its change data feed for versions `lo..hi`; rows go through ``map_row`` when given.
* :class:`SnapshotDesired`: ``snapshot(t)`` is ``query`` over the source at version `t`;
  ``changes(lo, hi)`` evaluates the query at each version and emits where consecutive results
  differ (a multiset anti-join both ways, partitioned by the view's key). It keeps the last
  result partitioned in Spark, never on the driver.

Both add row-level errors (:mod:`mvsink.row_errors`). The source's latest version comes from
listing its ``_delta_log``, which needs no Spark job.
"""

from __future__ import annotations

import logging
import re

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink import storage
from mvsink.row_errors import map_rows, null_key_errors
from mvsink.updates import DIFF, ERROR, TIME, table_schema
from mvsink.view import ChangesInput, ConfigError, SnapshotInput, ViewDefinition

log = logging.getLogger(__name__)

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def latest_version(table_uri: str) -> int | None:
    """The newest committed version of the Delta table at ``table_uri``; None if there is none."""
    fs, root = storage.filesystem(table_uri)
    from pyarrow.fs import FileSelector

    try:
        infos = fs.get_file_info(FileSelector(storage.join(root, "_delta_log"), allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return None
    versions = [int(m.group(1)) for i in infos if (m := _COMMIT_FILE.match(i.base_name))]
    return max(versions) if versions else None


def spark_uri(uri: str) -> str:
    """The URI Spark (Hadoop S3A) reads ``uri`` with."""
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri


class Desired:
    """Common part: the source table, the view's schema and row-level errors."""

    def __init__(self, spark: SparkSession, view: ViewDefinition):
        self.spark = spark
        self.view = view
        self.source = view.input.source
        if latest_version(self.source) is None:
            raise ConfigError(f"source {self.source} of view {view.view_id!r} is not a Delta table")
        self.user_schema = self._user_schema()
        missing = [k for k in view.key if k not in self.user_schema.names]
        if missing:
            raise ConfigError(f"key columns {missing} are not columns of view {view.view_id!r}: "
                              f"{self.user_schema.names}")
        try:
            self.schema = table_schema(self.user_schema)
        except ValueError as exc:
            raise ConfigError(f"view {view.view_id!r}: {exc}") from None

    def latest_version(self) -> int:
        version = latest_version(self.source)
        if version is None:
            raise ConfigError(f"source {self.source} has disappeared")
        return version

    def read_source(self, version: int) -> DataFrame:
        return self.spark.read.format("delta").option("versionAsOf", version).load(spark_uri(self.source))

    def _finish(self, updates: DataFrame) -> DataFrame:
        """Updates in the table schema, with null-key rows turned into errors."""
        return null_key_errors(updates, self.view.key).select(*self.schema.names)

    def _user_schema(self) -> T.StructType:
        raise NotImplementedError

    def snapshot(self, time: int) -> DataFrame:
        raise NotImplementedError

    def changes(self, lo: int, hi: int) -> DataFrame:
        raise NotImplementedError


class ChangesDesired(Desired):
    def __init__(self, spark: SparkSession, view: ViewDefinition):
        assert isinstance(view.input, ChangesInput)
        self.input: ChangesInput = view.input
        super().__init__(spark, view)
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
        return self.read_source(self.latest_version()).schema

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
        source = self.read_source(time)
        return self._to_view(source.select(
            *source.columns, F.lit(time).cast("long").alias(TIME), F.lit(1).cast("long").alias(DIFF)
        ))

    def changes(self, lo: int, hi: int) -> DataFrame:
        feed = (
            self.spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", lo).option("endingVersion", hi).load(spark_uri(self.source))
        )
        diff = (
            F.when(F.col("_change_type").isin("insert", "update_postimage"), F.lit(1))
            .when(F.col("_change_type").isin("delete", "update_preimage"), F.lit(-1))
        )
        source_cols = [c for c in feed.columns if c not in _CDF_COLUMNS]
        updates = feed.select(
            *source_cols, F.col("_commit_version").cast("long").alias(TIME), diff.cast("long").alias(DIFF)
        )
        return self._to_view(updates)


class SnapshotDesired(Desired):
    def __init__(self, spark: SparkSession, view: ViewDefinition):
        assert isinstance(view.input, SnapshotInput)
        self.input: SnapshotInput = view.input
        self._previous: DataFrame | None = None
        self._previous_time: int | None = None
        super().__init__(spark, view)

    def _contents(self, time: int) -> DataFrame:
        result = self.input.query(self.read_source(time))
        if not isinstance(result, DataFrame):
            raise ConfigError(f"query of view {self.view.view_id!r} returned {type(result).__name__}, "
                              "not a DataFrame")
        return result

    def _user_schema(self) -> T.StructType:
        return self._contents(self.latest_version()).schema

    def _remember(self, time: int, contents: DataFrame) -> None:
        if self.view.key:
            contents = contents.repartition(*self.view.key)
        self._previous = contents.localCheckpoint(eager=True)
        self._previous_time = time

    def _as_updates(self, rows: DataFrame, time: int, diff: int) -> DataFrame:
        return rows.select(
            *self.user_schema.names, F.lit(None).cast("string").alias(ERROR),
            F.lit(time).cast("long").alias(TIME), F.lit(diff).cast("long").alias(DIFF),
        )

    def snapshot(self, time: int) -> DataFrame:
        self._remember(time, self._contents(time).select(*self.user_schema.names))
        return self._finish(self._as_updates(self._previous, time, 1))

    def changes(self, lo: int, hi: int) -> DataFrame:
        if self._previous_time != lo - 1:
            raise RuntimeError(f"snapshot input asked for changes from {lo} after evaluating "
                               f"{self._previous_time}")
        parts = []
        for time in range(lo, hi + 1):
            previous = self._previous
            self._remember(time, self._contents(time).select(*self.user_schema.names))
            current = self._previous
            parts.append(self._as_updates(current.exceptAll(previous), time, 1))
            parts.append(self._as_updates(previous.exceptAll(current), time, -1))
        updates = parts[0]
        for part in parts[1:]:
            updates = updates.unionByName(part)
        return self._finish(updates)


def desired_for(spark: SparkSession, view: ViewDefinition) -> Desired:
    if isinstance(view.input, ChangesInput):
        return ChangesDesired(spark, view)
    return SnapshotDesired(spark, view)
