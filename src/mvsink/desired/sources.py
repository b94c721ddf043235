"""What every input has: the view's sources, read at the timeline's versions, and its schema.

:class:`Desired` checks at start that every source is a Delta table and that the timeline is not
behind them, and fixes the view's schema (the key columns must be among its columns). Source
versions come from listing their ``_delta_log`` (:mod:`mvsink.table`), which needs no Spark job.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from mvsink.desired.changes import Changes
from mvsink.desired.row_errors import NullKeyErrors
from mvsink.table import latest_version, spark_uri
from mvsink.timeline import Timeline
from mvsink.updates import table_schema
from mvsink.view import ConfigError, ViewDefinition


class Desired:
    """Common part: the sources, the timeline, the view's schema and row-level errors."""

    def __init__(self, spark: SparkSession, view: ViewDefinition, timeline: Timeline):
        self.spark = spark
        self.view = view
        self.timeline = timeline
        self.sources = dict(view.sources)
        self._null_key_errors = NullKeyErrors(view.key)
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

    def _change_feed_enabled(self, name: str) -> bool:
        """Whether source ``name`` has the change data feed on (its newest version's property)."""
        rows = self.spark.sql(f"SHOW TBLPROPERTIES delta.`{spark_uri(self.sources[name])}`").collect()
        return {r.key: r.value for r in rows}.get("delta.enableChangeDataFeed", "false").lower() == "true"

    def _finish(self, updates: DataFrame) -> DataFrame:
        """Updates in the table schema, with null-key rows turned into errors."""
        return self._null_key_errors(updates).select(*self.schema.names)

    def _user_schema(self) -> T.StructType:
        raise NotImplementedError

    def snapshot(self, time: int) -> DataFrame:
        raise NotImplementedError

    def strategy_description(self) -> str:
        """How the view's changes are computed, and why, in words."""
        raise NotImplementedError

    @property
    def snapshot_is_stored(self) -> bool:
        """Whether reading a :meth:`snapshot` again only reads stored rows (a pinned Delta
        version, a checkpoint) and runs no user code: it may then be read twice instead of kept."""
        raise NotImplementedError

    def hydrated(self, seconds: float) -> None:
        """The view's hydration (its contents at one time, folded into the buffer) took ``seconds``."""

    def changes(self, lo: int, hi: int) -> Changes | None:
        """The updates at times `[lo, hi]` (None if there are none)."""
        raise NotImplementedError
