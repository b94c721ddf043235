"""`compact`: advances a view's since and rewrites the files that hold times below it.

The view is readable at times `[since, upper)`. Compacting to `s` gives up the times below `s`:
with `c = min(s, upper - 1)`, every update with a time below `c` is advanced to `c` and the
updates are consolidated, so that the table holds one update per row where it held the row's whole
history. Advancing times below `c` to `c` leaves the contents at every time >= `c` as they were.

Invariants:

* The contents at every time >= `c` are unchanged; only the times below `c` are given up, and the
  since recorded is `s` (``mvsink.since`` in the commit info, read by :func:`mvsink.target.read.since_of`).
* The since never goes back: a compaction to an `s` not above the current since commits nothing,
  and so does one of a view that has written nothing yet.
* Only files holding a time below `c` by their statistics (or without statistics, such as foreign
  files) are rewritten, whole; every other file stays.
* One commit removes the rewritten files and adds their replacements, every action with
  ``dataChange = false``. It goes through :meth:`Shard.commit` like an append, carrying the view's
  txn at the upper it was computed for (`lower == upper`): if any commit of the view landed after
  the snapshot it read (an append, another compaction), or a foreign commit deleted one of its
  files, the commit fails, its staged files are deleted and the compaction starts over from the new
  snapshot (a bounded number of times).
* delta-rs does not see a conflict with a commit that removed the same files *without* data change
  (a foreign OPTIMIZE): both would land and the rows would be there twice. So right before
  committing, the compaction checks that its files are still in the latest snapshot, and starts
  over if not; only a foreign rewrite landing in the moment between check and commit slips through
  (read-back then sees the doubled rows as drift, corrected from the next upper on).
* Read-back is undisturbed: it sees the removed files negated and the added ones; per row, both
  sum to the same diff and differ only at times up to `c` < upper, so they cancel once advanced to
  the persist frontier (at least the upper).

In the table layout (:mod:`mvsink.target.layout`) there is no since to move: the table holds the view's
rows, and its history is Delta's versions. :func:`compact_files` rewrites the data files smaller
than :data:`SMALL_FILE_BYTES`, and the files whose deletion vectors delete at least
:data:`DELETED_SHARE` of their rows (:func:`worn_files`), into about one file per
:data:`_FILE_BYTES` (the same rows, without the deleted ones; every action ``dataChange = false``) and folds the view's error files into one (the same consolidated
errors), through the same commit path and checks.

A failure other than a conflict propagates; staged files it leaves behind carry the ``mvsink-``
prefix of :mod:`mvsink.write`, so :mod:`mvsink.cleanup` removes them unless a commit took them.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from functools import reduce
from dataclasses import dataclass

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink import storage
from mvsink.append import Shard

from mvsink.target.commit_info import META_READBACK, REASON_COMPACTION
from mvsink.target.layout import META_ERRORS
from mvsink.table import file_uri, latest_version, live_files
from mvsink.mint import Description
from mvsink.target.read import since_of
from mvsink.updates import DIFF, ERROR, RESERVED, TIME, advance_times, consolidate, normalize
from mvsink.write import StagedBatch, sort_column, stage
from mvsink.write.deletion_vectors import live_rows

log = logging.getLogger(__name__)

_MAX_ATTEMPTS = 10
#: Rewritten updates go into about one file per this many bytes of files removed.
_FILE_BYTES = 128 << 20
#: Table layout: data files below this size are rewritten together.
SMALL_FILE_BYTES = 32 << 20
#: Table layout: a data file whose deletion vector deletes at least this share of its rows is
#: rewritten without them (a reader still reads the deleted rows, then drops them).
DELETED_SHARE = 0.1


class CompactionError(RuntimeError):
    """A compaction kept conflicting with other commits and gave up."""


@dataclass(frozen=True)
class CompactionResult:
    #: The since now recorded for the view.
    since: int
    #: Table version of the compaction commit; None if nothing was committed.
    version: int | None
    files_removed: int
    files_added: int
    #: The commit's id (``mvsink.commit``) and the paths it added and removed, if it committed.
    commit_id: str | None = None
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    #: Table layout: the error files the commit lists (None: the update layout).
    error_files: list[str] | None = None


def compact(spark: SparkSession, shard: Shard, schema: T.StructType, since: int) -> CompactionResult:
    """Compact ``shard``'s view (table schema ``schema``) to ``since``; see the module doc."""
    for attempt in range(1, _MAX_ATTEMPTS + 1):
        if latest_version(shard.target) is None:
            return CompactionResult(0, None, 0, 0)
        table = shard.table()
        upper = shard.upper_of(table)
        current = since_of(table, shard.view_id)
        if current is None:
            return CompactionResult(upper, None, 0, 0)
        if since <= current:
            return CompactionResult(current, None, 0, 0)
        frontier = min(since, upper - 1)
        removes = files_below(table, frontier)
        dvs = _deletion_vectors(shard, table, removes)
        batch = _rewrite(spark, shard, schema, removes, dvs, Description(frontier, upper)) if removes else None
        added = batch.files if batch else []
        if not _still_present(shard, removes, dvs):
            # Removed by a rewrite without data change (e.g. a foreign OPTIMIZE): delta-rs would
            # not see the two commits conflict, and the rows would be there twice.
            _discard(shard, batch, f"files to compact were removed meanwhile (attempt {attempt})")
            continue
        commit_id = uuid.uuid4().hex
        try:
            shard.commit(table, upper, upper, REASON_COMPACTION, added, commit_id=commit_id,
                         removes=removes, data_change=False, since=since, removed_deletion_vectors=dvs)
        except CommitFailedError as exc:
            version = shard.landed(shard.table(), table.version(), {commit_id})
            if version is None:
                _discard(shard, batch, f"the commit conflicted (attempt {attempt}): {exc}")
                continue
        else:
            version = shard.landed(shard.table(), table.version(), {commit_id})
        log.info("compacted view %s to since %d (times below %d advanced) at version %s: -%d +%d files",
                 shard.view_id, since, frontier, version, len(removes), len(added))
        return CompactionResult(since, version, len(removes), len(added), commit_id,
                                tuple(f.path for f in added), tuple(path for path, _ in removes))
    raise CompactionError(f"compaction of view {shard.view_id!r} in {shard.target} to {since} "
                          f"conflicted {_MAX_ATTEMPTS} times")


def compact_files(spark: SparkSession, shard: Shard, schema: T.StructType, error_files: list[str],
                  key: list[str] | None = None) -> CompactionResult:
    """Table layout: the small data files rewritten into fewer, each in the order of the view's
    prune column (``key``'s first column, else the first), the error files ``error_files`` (the
    view's, as its read-back last saw them) folded into one; see the module doc."""
    columns = [f.name for f in schema.fields if f.name not in RESERVED]
    order_by = sort_column((key or columns)[0], schema)
    for attempt in range(1, _MAX_ATTEMPTS + 1):
        table = shard.table()
        upper = shard.upper_of(table)
        small = small_files(table)
        if len(small) < 2:
            small = []
        small += [f for f in worn_files(shard, table) if f not in small]
        if not small and len(error_files) <= 1:
            return CompactionResult(0, None, 0, 0)
        dvs = _deletion_vectors(shard, table, small)
        parts = []
        if small:
            rows = live_rows(spark, shard.target, {path: dvs.get(path) for path, _ in small},
                             T.StructType([f for f in schema.fields if f.name in columns]))
            partitions = max(1, math.ceil(sum(size for _, size in small) / _FILE_BYTES))
            parts.append(rows.coalesce(partitions).select(
                *columns, F.lit(None).cast("string").alias(ERROR), F.lit(upper).cast("long").alias(TIME),
                F.lit(1).cast("long").alias(DIFF)))
        if error_files:
            errors = normalize(spark.read.schema(schema).parquet(*[file_uri(shard.target, p) for p in error_files]),
                               schema)
            parts.append(consolidate(advance_times(errors, upper)).coalesce(1))
        batch = stage(reduce(DataFrame.unionByName, parts), Description(upper, upper + 1), shard.target,
                      shard.view_id, shard.replica_id, plain_columns=columns, order_by=order_by)
        if not _still_present(shard, small, dvs):
            _discard(shard, batch, f"files to compact were removed meanwhile (attempt {attempt})")
            continue
        commit_id = uuid.uuid4().hex
        folded = [f.path for f in batch.error_files]
        try:
            shard.commit(table, upper, upper, REASON_COMPACTION, batch.files, commit_id=commit_id, removes=small,
                         data_change=False, extra={META_ERRORS: json.dumps(folded), META_READBACK: table.version()},
                         removed_deletion_vectors=dvs)
        except CommitFailedError as exc:
            if shard.landed(shard.table(), table.version(), {commit_id}) is None:
                _discard(shard, batch, f"the commit conflicted (attempt {attempt}): {exc}")
                continue
        version = shard.landed(shard.table(), table.version(), {commit_id})
        log.info("compacted the files of view %s at version %s: -%d +%d files, %d error files folded into %d",
                 shard.view_id, version, len(small), len(batch.files), len(error_files), len(folded))
        return CompactionResult(0, version, len(small), len(batch.files), commit_id,
                                tuple(f.path for f in batch.files), tuple(path for path, _ in small), folded)
    raise CompactionError(f"compaction of the files of view {shard.view_id!r} in {shard.target} "
                          f"conflicted {_MAX_ATTEMPTS} times")


def small_files(table: DeltaTable) -> list[tuple[str, int]]:
    """`(path, size)` of the snapshot's data files smaller than :data:`SMALL_FILE_BYTES`."""
    actions = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"]).to_pylist()
    return [(a["path"], a["size_bytes"]) for a in actions if a["size_bytes"] < SMALL_FILE_BYTES]


def worn_files(shard: Shard, table: DeltaTable) -> list[tuple[str, int]]:
    """`(path, size)` of the snapshot's data files whose deletion vector deletes at least
    :data:`DELETED_SHARE` of their rows (none where the shard does not allow deletion vectors)."""
    if not shard.deletion_vectors or "deletionVectors" not in (table.protocol().reader_features or ()):
        return []
    live = storage.retrying(f"listing the files of {shard.target}", live_files, shard.target, table.version())
    worn = []
    for path, add in live.items():
        vector = add.get("deletionVector")
        rows = json.loads(add.get("stats") or "{}").get("numRecords")
        if vector and rows and vector["cardinality"] >= DELETED_SHARE * rows:
            worn.append((path, add["size"]))
    return sorted(worn)


def _deletion_vectors(shard: Shard, table: DeltaTable, files: list[tuple[str, int]]) -> dict[str, dict]:
    """The deletion vector of each of ``files`` that has one in ``table``'s snapshot (none where
    the shard does not allow them: the guard refused the table then)."""
    if not shard.deletion_vectors or not files:
        return {}
    live = storage.retrying(f"listing the files of {shard.target}", live_files, shard.target, table.version())
    return {path: live[path]["deletionVector"] for path, _ in files
            if path in live and live[path].get("deletionVector")}


def _still_present(shard: Shard, files: list[tuple[str, int]], deletion_vectors: dict[str, dict]) -> bool:
    """Whether the latest snapshot still holds all of ``files``, each with the deletion vector it
    had (``deletion_vectors``) where the shard allows them."""
    return not files or shard.holds(shard.table(), files, deletion_vectors)


def _discard(shard: Shard, batch: StagedBatch | None, why: str) -> None:
    log.info("compaction of view %s starts over: %s", shard.view_id, why)
    if batch:
        batch.delete()


def files_below(table: DeltaTable, frontier: int) -> list[tuple[str, int]]:
    """`(path, size)` of the snapshot's files that may hold a time below ``frontier``."""
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return [(a["path"], a["size_bytes"]) for a in actions
            if (earliest := _earliest_time(a)) is None or earliest < frontier]


def _earliest_time(action: dict) -> int | None:
    """The smallest time in a file by its statistics (a null time reads as 0); None if unknown."""
    if action.get("num_records") is None:
        return None
    earliest = action.get(f"min.{TIME}")
    nulls = action.get(f"null_count.{TIME}")
    if nulls is None or nulls > 0:
        return 0 if earliest is None else min(earliest, 0)
    return earliest


def _rewrite(spark: SparkSession, shard: Shard, schema: T.StructType, files: list[tuple[str, int]],
             deletion_vectors: dict[str, dict], desc: Description) -> StagedBatch:
    """Stage ``files``' updates (without the rows their ``deletion_vectors`` delete) with times
    advanced to `desc.lower`, consolidated."""
    updates = normalize(live_rows(spark, shard.target, {path: deletion_vectors.get(path) for path, _ in files},
                                  schema), schema)
    compacted = consolidate(advance_times(updates, desc.lower))
    partitions = max(1, math.ceil(sum(size for _, size in files) / _FILE_BYTES))
    return stage(compacted.coalesce(partitions), desc, shard.target, shard.view_id, shard.replica_id)
