"""Read-back: the updates committed to the target table by anyone since the last look.

The read-back remembers the set of data files of the table version it last saw. The persisted
updates between that version and the latest are the rows of the files added since (with their
diffs) and the rows of the files removed since (negated). This covers every kind of commit: an
mvsink append (adds), another replica's append, a foreign append, a ``DELETE`` or ``UPDATE``
(removes files and adds rewritten ones), an overwrite (removes everything), a compaction (no net
change). Only file lists reach the driver; the rows are read by Spark.

The first poll sees the whole table as added, which is how a replica hydrates its persisted side.

A foreign commit is one that does not carry this view's commit info; the read-back reports them
so that the commit that repairs them can say so. Commits listed as repaired by an mvsink commit
are reported too, so that a replica stops claiming a repair another replica made.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from mvsink import storage
from mvsink.inputs import latest_version
from mvsink.append import META_REPAIRS, META_VIEW, Shard
from mvsink.updates import negate, normalize

log = logging.getLogger(__name__)

#: Foreign operations that never change a table's contents.
_CONTENT_PRESERVING = {"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES", "CHECKPOINT"}


class ReadBackError(RuntimeError):
    """The table changed in a way the read-back cannot follow incrementally."""


@dataclass
class Persisted:
    version: int
    upper: int
    #: Updates committed since the previous poll (None: nothing changed).
    updates: DataFrame | None
    foreign_versions: list[int] = field(default_factory=list)
    repaired_versions: list[int] = field(default_factory=list)


class ReadBack:
    def __init__(self, spark: SparkSession, shard: Shard, schema: T.StructType):
        self.spark = spark
        self.shard = shard
        self.schema = schema
        self.version = -1
        self.files: set[str] = set()

    def reset(self) -> None:
        self.version = -1
        self.files = set()

    def poll(self) -> Persisted:
        if latest_version(self.shard.target) is None:
            return Persisted(-1, 0, None)  # not created yet: no writer has written
        table = self.shard.table()
        version = table.version()
        upper = self.shard.upper_of(table)
        if version == self.version:
            return Persisted(version, upper, None)
        features = set(table.protocol().reader_features or [])
        if "deletionVectors" in features:
            raise ReadBackError(f"{self.shard.target} has deletion vectors, which mvsink cannot read back")
        files = set(table.get_add_actions(flatten=True).column("path").to_pylist())
        added, removed = files - self.files, self.files - files
        foreign, repaired = self._classify(version)
        parts = []
        if added:
            parts.append(self._read(added))
        if removed:
            parts.append(negate(self._read(removed)))
        updates = None
        if parts:
            updates = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        log.debug("read back versions %d..%d: +%d -%d files, upper %d",
                  self.version + 1, version, len(added), len(removed), upper)
        self.version, self.files = version, files
        return Persisted(version, upper, updates, foreign, repaired)

    def _classify(self, version: int) -> tuple[list[int], list[int]]:
        """Versions after the last poll that are foreign writes, and versions repaired by mvsink."""
        if self.version < 0:
            return [], []
        foreign, repaired = [], []
        # Each version's own log entry: delta-rs' history() numbers commits newer than the loaded
        # snapshot from the snapshot's version, so its versions can be off under concurrency.
        for v in range(self.version + 1, version + 1):
            info = self.shard.commit_info(v)
            if info.get(META_VIEW) == self.shard.view_id:
                repaired.extend(_as_list(info.get(META_REPAIRS)))
            elif info.get("operation") not in _CONTENT_PRESERVING:
                foreign.append(v)
        return sorted(foreign), repaired

    def _read(self, paths: set[str]) -> DataFrame:
        uris = [file_uri(self.shard.target, p) for p in sorted(paths)]
        return normalize(self.spark.read.schema(self.schema).parquet(*uris), self.schema)


def _as_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, str):
        value = json.loads(value)
    return [int(v) for v in value]


def file_uri(target: str, path: str) -> str:
    path = unquote(path)
    if "://" in path or path.startswith("/"):
        return path
    uri = storage.join(target, path)
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri
