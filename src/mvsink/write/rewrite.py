"""`rewrite`: a table-layout batch's retractions, as rewrites of the files that hold them.

In the table layout (:mod:`mvsink.layout`) the table holds the view's rows, so a retraction (an ok
row with diff `-k`) takes `k` copies of the row out of the table: copy-on-write of the files that
hold them. The files searched are the table's files as the read-back last saw them, the files the
correction buffer was computed against; the commit that removes them is only made on a snapshot
that still holds every one of them (:func:`mvsink.append.compare_and_append`), so a file rewritten
here is never one that changed meanwhile.

1. The retractions' values of the *prune column* (the view's first key column, else its first
   column) and counts are gathered (one small Spark job over the batch); files whose min/max
   statistics cannot hold any of those values are not read.
2. The other files are read with each row's file and position (Spark's ``_metadata``), joined with
   the retractions on the whole row (null-safe), and the first `k` copies of each retracted row in
   (file, position) order are the deletions: only their positions reach the driver.
3. Each file with a deletion is rewritten by one Spark task (pyarrow: the file without those
   positions, rows in their order) into a staged file; the batch removes the file and adds its
   survivors (no file when none survive).

Invariants: exactly `k` copies of each retracted row go, or :class:`RetractionNotFound` is raised
and nothing is staged (the table does not hold what the buffer says it does: the read-back is
behind it); only files holding a deleted copy are rewritten.
"""

from __future__ import annotations

import bisect
import logging
import os
from dataclasses import dataclass
from functools import reduce
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink import storage
from mvsink.table import file_uri
from mvsink.updates import DIFF
from mvsink.write import _FILE_LIST_SCHEMA, StagedFile, _FileWriter

log = logging.getLogger(__name__)

#: Retracted values of the prune column gathered to the driver at most; past it, only the range.
_MAX_PRUNE_VALUES = 100_000
#: Retractions broadcast to the join with the table's rows up to this many.
_BROADCAST_RETRACTIONS = 200_000


class RetractionNotFound(RuntimeError):
    """The table's files hold fewer copies of a retracted row than the batch retracts."""


@dataclass(frozen=True)
class TableFile:
    """A data file of the table as its add action describes it."""

    path: str
    size: int
    #: The prune column's bounds and null count by the file's statistics (None: unknown).
    low: object = None
    high: object = None
    nulls: int | None = None


@dataclass
class Rewrites:
    files: list[StagedFile]
    removes: list[tuple[str, int]]
    #: Retraction updates (rows of the batch) and copies deleted.
    retractions: int
    deleted: int


def rewrite_retractions(spark: SparkSession, retractions: DataFrame, table_files: list[TableFile],
                        target: str, prefix: str, columns: list[str], prune_column: str) -> Rewrites:
    """Stage the rewrites that take ``retractions`` (ok updates with negative diffs, the view's
    ``columns``) out of ``table_files``; see the module doc."""
    counts = retractions.groupBy(prune_column).agg(F.count(F.lit(1)).alias("n"), F.sum(-F.col(DIFF)).alias("k"))
    gathered = counts.limit(_MAX_PRUNE_VALUES + 1).collect()
    if not gathered:
        return Rewrites([], [], 0, 0)
    if len(gathered) > _MAX_PRUNE_VALUES:
        row = counts.agg(F.sum("n"), F.sum("k"), F.min(prune_column), F.max(prune_column),
                         F.max(F.col(prune_column).isNull().cast("int"))).first()
        updates, copies = row[0], row[1]
        candidates = _prune_by_range(table_files, row[2], row[3], bool(row[4]))
    else:
        updates, copies = sum(r.n for r in gathered), sum(r.k for r in gathered)
        candidates = _prune_by_values(table_files, [r[0] for r in gathered])
    deletions = _deletions(spark, retractions, candidates, target, columns, updates) if candidates else []
    if len(deletions) != copies:
        raise RetractionNotFound(
            f"the table's files hold {len(deletions)} of the {copies} row copies the batch retracts; "
            "the read-back is behind the table")
    by_file: dict[str, list[int]] = {}
    for name, position in deletions:
        by_file.setdefault(name, []).append(position)
    touched = [f for f in candidates if os.path.basename(unquote(f.path)) in by_file]
    staged = _rewrite(spark, touched, by_file, target, prefix)
    log.info("retracting %d copies (%d updates): %d of %d files read, %d rewritten", copies, updates,
             len(candidates), len(table_files), len(touched))
    return Rewrites(staged, [(f.path, f.size) for f in touched], updates, copies)


def _prune_by_values(files: list[TableFile], values: list) -> list[TableFile]:
    """The files whose statistics allow one of ``values`` (None: a null)."""
    has_null = any(v is None for v in values)
    try:
        present = sorted(v for v in values if v is not None)
    except TypeError:
        return files
    kept = []
    for f in files:
        if f.low is None or f.high is None:
            kept.append(f)
            continue
        if has_null and (f.nulls is None or f.nulls > 0):
            kept.append(f)
            continue
        try:
            i = bisect.bisect_left(present, f.low)
            if i < len(present) and present[i] <= f.high:
                kept.append(f)
        except TypeError:
            kept.append(f)
    return kept


def _prune_by_range(files: list[TableFile], low, high, has_null: bool) -> list[TableFile]:
    kept = []
    for f in files:
        try:
            overlaps = f.low is None or f.high is None or low is None or not (f.high < low or f.low > high)
        except TypeError:
            overlaps = True
        if overlaps or (has_null and (f.nulls is None or f.nulls > 0)):
            kept.append(f)
    return kept


def _deletions(spark: SparkSession, retractions: DataFrame, files: list[TableFile], target: str,
               columns: list[str], updates: int) -> list[tuple[str, int]]:
    """(file name, row position) of the copies to delete: the first `k` of each retracted row."""
    schema = T.StructType([f for f in retractions.schema.fields if f.name in columns])
    rows = (spark.read.schema(schema).parquet(*[file_uri(target, f.path) for f in files])
            .select(*columns, F.col("_metadata.file_path").alias("_mv_file"),
                    F.col("_metadata.row_index").alias("_mv_pos")))
    wanted = retractions.select(*[F.col(c).alias(f"_mv_r_{c}") for c in columns], (-F.col(DIFF)).alias("_mv_k"))
    if updates <= _BROADCAST_RETRACTIONS:
        wanted = F.broadcast(wanted)
    same_row = reduce(lambda a, b: a & b, [F.col(c).eqNullSafe(F.col(f"_mv_r_{c}")) for c in columns])
    matched = rows.join(wanted, same_row)
    copy = F.row_number().over(Window.partitionBy(*columns).orderBy("_mv_file", "_mv_pos"))
    chosen = matched.withColumn("_mv_copy", copy).where(F.col("_mv_copy") <= F.col("_mv_k"))
    return [(os.path.basename(unquote(r[0])), r[1]) for r in chosen.select("_mv_file", "_mv_pos").collect()]


def _rewrite(spark: SparkSession, files: list[TableFile], deletions: dict[str, list[int]], target: str,
             prefix: str) -> list[StagedFile]:
    """Each of ``files`` without its deleted positions, staged by one Spark task per file."""
    if not files:
        return []
    jobs = [(f.path, deletions[os.path.basename(unquote(f.path))]) for f in files]
    frame = spark.createDataFrame(jobs, "path STRING, positions ARRAY<BIGINT>").repartition(len(jobs))

    def rewrite(batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        fs, root = storage.filesystem(target)
        for batch in batches:
            for index, (path, positions) in enumerate(zip(batch.column("path").to_pylist(),
                                                          batch.column("positions").to_pylist())):
                table = storage.retrying(f"reading {path}", _read, fs, storage.join(root, unquote(path)))
                keep = np.ones(table.num_rows, dtype=bool)
                keep[np.asarray(positions, dtype=np.int64)] = False
                writer = _FileWriter(target, f"{prefix}-rw{context.partitionId():05d}-{index}-"
                                             f"{context.attemptNumber()}.parquet")
                try:
                    for piece in table.filter(pa.array(keep)).to_batches():
                        writer.write(piece)
                    row = writer.close()
                except BaseException:
                    writer.abort()
                    raise
                if row is not None:
                    yield pa.RecordBatch.from_pydict({**row, "errors": pa.array([False]),
                                                      "updates": pa.array([0], pa.int64())})

    rows = frame.mapInArrow(rewrite, _FILE_LIST_SCHEMA).collect()
    return [StagedFile(r.path, r.size, r.num_records, r.stats) for r in rows]


def _read(fs, path: str) -> pa.Table:
    with fs.open_input_file(path) as f:
        return pq.read_table(f)
