"""What every input has: the view's sources, read at the timeline's versions, and its schema.

:class:`Desired` checks at start that every source is a Delta table and that the timeline is not
behind them, and fixes the view's schema (the key columns must be among its columns): a column
a source gains later is not in the view, which :meth:`Desired.warn_of_new_columns` says. Source
versions come from listing their ``_delta_log`` (:mod:`mvsink.table`), which needs no Spark job.
"""

from __future__ import annotations

import json
import logging

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from mvsink.desired.changes import Changes
from mvsink.desired.row_errors import NullKeyErrors
from mvsink.table import latest_version, log_actions, spark_uri
from mvsink.timeline import Timeline
from mvsink.updates import table_schema
from mvsink.view import ConfigError, ViewDefinition

log = logging.getLogger(__name__)


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
        versions = self.schema_versions()
        #: source read -> (the version last checked for new columns, the columns known so far).
        self._columns_seen = {name: (versions[name], set(self.read_source(name, versions[name]).columns))
                              for name in self.sources_read()}

    def sources_read(self) -> list[str]:
        """The sources the view's rows come from: all of them, unless the input knows better."""
        return list(self.sources)

    def warn_of_new_columns(self, versions: dict[str, int]) -> None:
        """Log at WARNING, once per column, a column a source gained up to ``versions`` (read
        from the commits' metadata actions, no Spark job): the view keeps the columns it started
        with, a ``SELECT *`` too, so the new column is not in it until the view is redefined."""
        for name, (seen, columns) in list(self._columns_seen.items()):
            version = versions[name]
            new: list[str] = []
            for v in range(seen + 1, version + 1):
                try:
                    actions = log_actions(self.sources[name], v)
                except FileNotFoundError:  # the log entry is cleaned up: nothing to tell from it
                    continue
                for action in actions:
                    if "metaData" in action:
                        fields = json.loads(action["metaData"]["schemaString"])["fields"]
                        new += [f["name"] for f in fields if f["name"] not in columns and f["name"] not in new]
            if new:
                log.warning("view %s: source %s has new column(s) %s (version %d); the view keeps its columns "
                            "%s (fixed when it started, SELECT * too): redefine the view to take them in",
                            self.view.view_id, name, ", ".join(new), version, ", ".join(self.user_schema.names))
            self._columns_seen[name] = (max(seen, version), columns | set(new))

    def latest_versions(self) -> dict[str, int]:
        """Every declared source's newest version."""
        versions = {}
        for name, path in self.view.sources.items():
            version = latest_version(path)
            if version is None:
                raise ConfigError(f"source {name} ({path}) of view {self.view.view_id!r} has disappeared")
            versions[name] = version
        return versions

    def versions(self, time: int) -> dict[str, int]:
        """The source versions time ``time`` stands for (:meth:`Timeline.versions`), by the
        names the query reads them under."""
        return self.timeline.versions(time)

    def schema_versions(self) -> dict[str, int]:
        """The versions the view's schema is taken from: the latest time's, else the newest."""
        last = self.timeline.last()
        return dict(last.versions) if last is not None else self.latest_versions()

    def read_source(self, name: str, version: int, spark: SparkSession | None = None) -> DataFrame:
        reader = (spark or self.spark).read.format("delta").option("versionAsOf", version)
        return reader.load(spark_uri(self.sources[name]))

    def session(self) -> SparkSession:
        """The session the view's plans are optimized and run in (the buffer folds its rows there)."""
        return self.spark

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
