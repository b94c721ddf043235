"""Read-back: the updates committed to the target table by anyone since the last look.

The read-back remembers the set of data files of the table version it last saw. The persisted
updates between that version and the latest are the rows of the files added since (with their
diffs) and the rows of the files removed since (negated). This covers every kind of commit: an
mvsink append (adds), another replica's append, a foreign append, a ``DELETE`` or ``UPDATE``
(removes files and adds rewritten ones), an overwrite (removes everything), a compaction (no net
change). Only file lists reach the driver; the rows are read by Spark.

The first poll sees the whole table as added, which is how a replica hydrates its persisted side.
A poll that finds the target's log at the version it last polled answers from that snapshot: an
idle view's poll lists the log and loads no table.

A replica whose append just won need not read its own files back: it knows their rows (the
buffer's updates below the batch's upper). Nor its own compaction's (the same contents at every
time from the upper on). :meth:`ReadBack.adopt` takes such a commit as read when it is the next
version after the last poll (so nothing else landed in between), and the caller drops an
append's updates from its buffer; any other case is left to the next poll.

A foreign commit is one that does not carry this view's commit info. For each, the read-back
also returns its *undo*: the rows of the files it removed minus the rows of the files it added,
at their own times. Added to the table, an undo makes every time exactly what it was before the
foreign commit, which is how a repair restores the view's history and not only its present
(:mod:`mvsink.sink`). Each mvsink commit records the table version its replica had read back
(``mvsink.readback``): every foreign commit up to that version is accounted for by it, in its
history or at its lower, so no other replica repairs it again.

A table with deletion vectors is followed by *logical* files, a data file's path and its DV
(:func:`~mvsink.write.deletion_vectors.logical_file`), read without the rows their DVs delete
(:func:`~mvsink.write.deletion_vectors.live_rows`). Rows deleted by a DV are a ``remove`` of the
file with its old DV and an ``add`` with the new one: the file's rows under the new DV less its
rows under the old are the rows deleted, negated, as a rewrite of the file would give. Such a
table's files are listed from its log (:func:`mvsink.table.live_files`, delta-rs's file list has
no DVs).

In the table layout (:mod:`mvsink.target.layout`) a data file's rows are ok rows at diff +1, and the
view's error files (listed by its newest commit, ``mvsink.errors``) count as files of the table:
a commit that lists a new one adds its error updates. A foreign commit's undo is not read there:
Delta's versions are the history, and a repair is the next commit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from mvsink import storage
from mvsink.table import CONTENT_PRESERVING, file_uri, latest_version, live_files, log_actions
from mvsink.write.deletion_vectors import live_rows, logical_file, path_of
from mvsink.append import Shard
from mvsink.target.commit_info import META_COMMIT, META_READBACK, META_VIEW
from mvsink.target.guard import UpperWentBackwards
from mvsink.target.layout import TABLE, error_files
from mvsink.updates import negate, normalize

log = logging.getLogger(__name__)


class ReadBackError(RuntimeError):
    """The table changed in a way the read-back cannot follow incrementally."""


@dataclass
class Persisted:
    version: int
    upper: int
    #: Updates committed since the previous poll (None: nothing changed).
    updates: DataFrame | None
    #: Foreign commits since the previous poll: version -> its undo (updates at their own times).
    foreign: dict[int, DataFrame] = field(default_factory=dict)
    #: The latest table version an mvsink commit read since the previous poll accounts for.
    accounted_through: int = -1


class ReadBack:
    def __init__(self, spark: SparkSession, shard: Shard, schema: T.StructType, layout: str):
        self.spark = spark
        self.shard = shard
        self.schema = schema
        self.layout = layout
        self.version = -1
        #: The files of the table as last seen (data files, and the view's error files): logical
        #: files where a file has a deletion vector (see the module doc).
        self.files: set[str] = set()
        #: The deletion vector of each logical file of :attr:`files` that has one.
        self.deletion_vectors: dict[str, dict] = {}
        #: Table layout: the error files in force at the version last seen.
        self.error_files: list[str] = []
        #: The snapshot last polled and its upper; None after an adopt (the version is then one
        #: the read-back did not load). A poll that finds no newer version answers from them.
        self._snapshot: tuple[DeltaTable, int] | None = None

    def reset(self) -> None:
        self.version = -1
        self.files = set()
        self.deletion_vectors = {}
        self.error_files = []
        self._snapshot = None

    def poll(self) -> Persisted:
        latest = latest_version(self.shard.target)
        if latest is None:
            if self.version >= 0:
                raise UpperWentBackwards(f"{self.shard.target} is no longer a Delta table; it was at "
                                         f"version {self.version}")
            return Persisted(-1, 0, None)  # not created yet: no writer has written
        if latest == self.version and self._snapshot is not None:  # no commit since the last poll
            table, upper = self._snapshot
            self.shard.observe_fence(table)
            return Persisted(latest, upper, None)
        table = self.shard.table()
        version = table.version()
        if version == self.version:
            upper = self.shard.upper_of(table)
            self._snapshot = (table, upper)
            return Persisted(version, upper, None)
        foreign, accounted, errors = self._classify(version)
        upper = self.shard.upper_of(table)
        deletion_vectors = {}
        if "deletionVectors" in (table.protocol().reader_features or ()):
            live = storage.retrying(f"listing the files of {self.shard.target}", live_files, self.shard.target, version)
            files = {logical_file(path, add.get("deletionVector")) for path, add in live.items()}
            deletion_vectors = {logical_file(path, add["deletionVector"]): add["deletionVector"]
                                for path, add in live.items() if add.get("deletionVector")}
        else:
            files = set(table.get_add_actions(flatten=True).column("path").to_pylist())
        if self.layout == TABLE:
            self.error_files = errors if errors is not None else (
                self.error_files if self.version >= 0 else self._error_files_at(version))
            files |= set(self.error_files)
        added, removed = files - self.files, self.files - files
        parts = []
        if added:
            parts.append(self._read(added, deletion_vectors))
        if removed:
            parts.append(negate(self._read(removed, self.deletion_vectors)))
        updates = None
        if parts:
            updates = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        log.debug("read back versions %d..%d: +%d -%d files, upper %d",
                  self.version + 1, version, len(added), len(removed), upper)
        self.version, self.files, self._snapshot = version, files, (table, upper)
        self.deletion_vectors = deletion_vectors
        return Persisted(version, upper, updates, foreign, accounted)

    def snapshot(self) -> DeltaTable | None:
        """The table at the version last polled (its files are :attr:`files`), if a poll loaded it
        and no adopt has moved past it since."""
        return self._snapshot[0] if self._snapshot is not None else None

    def contents(self, files: set[str] | None = None) -> DataFrame:
        """The table's rows at the version last seen, as updates: the rows of its files (of
        ``files`` only, a subset of them, if given), read by Spark from the file list this
        read-back keeps (no Delta snapshot to build)."""
        files = self.files if files is None else files
        if not files:
            return self.spark.createDataFrame([], self.schema)
        return self._read(files, self.deletion_vectors)

    def adopt(self, commit_ids: frozenset[str], added: list[str], removed: tuple[str, ...] = (),
              error_files: list[str] | None = None, marked: tuple[dict, ...] = ()) -> bool:
        """Take the view's own winning commit (carrying one of ``commit_ids``, adding the files
        ``added`` and the add actions ``marked``, files under new deletion vectors, and removing
        the files at the paths ``removed``, whatever their vectors) as read back, if it is the
        next version after the last poll, or version 1 after a poll that found no table and a
        version 0 that added no files. False: left to the next poll."""
        base = self.version
        if base < 0:
            created = storage.retrying(f"reading version 0 of {self.shard.target}", log_actions,
                                       self.shard.target, 0)
            if any("add" in a for a in created):
                return False
            base = 0
        try:
            actions = storage.retrying(f"reading version {base + 1} of {self.shard.target}", log_actions,
                                       self.shard.target, base + 1)
        except FileNotFoundError:
            return False
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if info.get(META_COMMIT) not in commit_ids:
            return False
        self.shard.history.record(base + 1, actions)
        gone = {name for name in self.files if path_of(name) in set(removed)}
        self.deletion_vectors = {name: dv for name, dv in self.deletion_vectors.items() if name not in gone}
        for add in marked:
            name = logical_file(add["path"], add["deletionVector"])
            self.deletion_vectors[name] = add["deletionVector"]
            added = [*added, name]
        self.version, self.files = base + 1, (self.files - gone) | set(added)
        self._snapshot = None
        if error_files is not None:
            self.files = (self.files - set(self.error_files)) | set(error_files)
            self.error_files = list(error_files)
        return True

    def _classify(self, version: int) -> tuple[dict[int, DataFrame | None], int, list[str] | None]:
        """The foreign commits after the last poll with their undos (None in the table layout),
        the latest version that an mvsink commit of the view among them accounts for, and the
        error files the newest of those lists (None: none lists any)."""
        if self.version < 0:
            return {}, -1, None
        foreign, accounted, errors = {}, -1, None
        # Each version's own log entry: delta-rs' history() numbers commits newer than the loaded
        # snapshot from the snapshot's version, so its versions can be off under concurrency.
        for v in range(self.version + 1, version + 1):
            actions = storage.retrying(f"reading version {v} of {self.shard.target}", log_actions,
                                       self.shard.target, v)
            self.shard.history.record(v, actions)
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            if info.get(META_VIEW) == self.shard.view_id:
                if info.get(META_READBACK) is not None:
                    accounted = max(accounted, int(info[META_READBACK]))
                errors = error_files(info) if error_files(info) is not None else errors
            elif info.get("operation") not in CONTENT_PRESERVING and self.layout == TABLE:
                foreign[v] = None
            elif info.get("operation") not in CONTENT_PRESERVING:
                dvs = {logical_file(f["path"], f["deletionVector"]): f["deletionVector"]
                       for a in actions for f in (a.get("add"), a.get("remove")) if f and f.get("deletionVector")}
                added = {logical_file(a["add"]["path"], a["add"].get("deletionVector")) for a in actions if "add" in a}
                removed = {logical_file(a["remove"]["path"], a["remove"].get("deletionVector"))
                           for a in actions if "remove" in a}
                parts = (([negate(self._read(added, dvs))] if added else [])
                         + ([self._read(removed, dvs)] if removed else []))
                undo = parts[0].unionByName(parts[1]) if len(parts) == 2 else (parts[0] if parts else None)
                foreign[v] = (undo if undo is not None else self.spark.createDataFrame([], self.schema)
                              ).localCheckpoint(eager=True)
        return foreign, accounted, errors

    def _error_files_at(self, version: int) -> list[str]:
        """The error files the view's newest commit at or before ``version`` lists (none where
        no commit of the view lists any, or its log entry is gone)."""
        for v in range(version, -1, -1):
            try:
                actions = storage.retrying(f"reading version {v} of {self.shard.target}", log_actions,
                                           self.shard.target, v)
            except FileNotFoundError:
                break
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            if info.get(META_VIEW) == self.shard.view_id and error_files(info) is not None:
                return error_files(info)
        return []

    def _read(self, files: set[str], deletion_vectors: dict[str, dict]) -> DataFrame:
        """The rows of the logical ``files`` (their DVs in ``deletion_vectors``) as updates."""
        if any(f in deletion_vectors for f in files):
            rows = live_rows(self.spark, self.shard.target, {path_of(f): deletion_vectors.get(f) for f in files},
                             self.schema)
        else:
            rows = self.spark.read.schema(self.schema).parquet(*[file_uri(self.shard.target, p) for p in sorted(files)])
        return normalize(rows, self.schema)

