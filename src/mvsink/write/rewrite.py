"""`rewrite`: a table-layout batch's retractions, as rewrites of the files that hold them.

In the table layout (:mod:`mvsink.target.layout`) the table holds the view's rows, so a retraction (an ok
row with diff `-k`) takes `k` copies of the row out of the table: copy-on-write of the files that
hold them. The files searched are the table's files as the read-back last saw them, the files the
correction buffer was computed against; the commit that removes them is only made on a snapshot
that still holds every one of them (:func:`mvsink.append.compare_and_append`), so a file rewritten
here is never one that changed meanwhile. Files whose min/max statistics of the *prune column*
(the view's first key column, else its first column; :func:`mvsink.file_stats.bounds`) cannot
hold a retracted value are not read.

Two ways, both rewriting a file with pyarrow (the file without the deleted positions; a file
sorted by the prune column stays sorted, see :func:`mvsink.write.sort_column`):

* :func:`rewrite_gathered`, for a batch held on the driver (:mod:`mvsink.write.plain`): the
  retractions are broadcast, and one task per candidate file (or the driver, where the
  candidates are small: :data:`DRIVER_REWRITE_BYTES`) finds their copies in it (a
  vectorized membership test column by column, then whole rows compared, null equal to null and
  NaN to NaN, as Spark's null-safe equality has it), deletes up to `k` copies of each and writes
  its share of the batch's inserted rows into the rewrite, so a step that rewrites files adds
  none. A row whose copies lie in several files may lose more than `k` that way: the files
  concerned are rewritten again with the first `k` copies in file order as their quota. One
  Spark job (none in the driver), two in that rare case.
* :func:`rewrite_retractions`, for a batch that stays in Spark: the candidate files are read with
  each row's file and position (Spark's ``_metadata``), joined with the retractions on the whole
  row (null-safe), and the first `k` copies of each in (file, position) order are deleted; only
  their positions reach the driver.

Where the target takes deletion vectors and the view marks its retractions in them
(``mark``, :attr:`mvsink.view.ViewDefinition.deletion_vectors`), both ways find the same copies
but write no file: each file holding one keeps its rows and gets a deletion vector that also
marks those positions deleted (:func:`mvsink.write.deletion_vectors.delete_rows`; the file's
``remove`` under its old vector and ``add`` under the new one, :attr:`Rewrites.marked`), and the
inserted rows go to new files. A gathered batch first reads only the prune column of the
candidate files: where one retraction (`k` copies) has a prune value and the files hold exactly
`k` live rows with it (a keyed view's retractions, as a rule), those are its copies; only the rest
are compared whole. A step then costs its changes and a read of one column, not the files they fall
in; the files whose deleted share grows are rewritten by the compaction (:mod:`mvsink.append.compact`).

Invariants: exactly `k` copies of each retracted row go, or :class:`RetractionNotFound` is raised
and nothing is staged (the table does not hold what the buffer says it does: the read-back is
behind it); only files holding a deleted copy are rewritten or marked.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from dataclasses import dataclass, field
from functools import reduce
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from mvsink import storage
from mvsink.file_stats import bounds, overlaps
from mvsink.updates import DIFF
from mvsink.write import _FILE_LIST_SCHEMA, StagedFile, _delete_if_exists, _FileWriter, sorted_rows
from mvsink.write.deletion_vectors import FILE, ROW, delete_rows, live_rows, read_dv

log = logging.getLogger(__name__)

#: The most bytes of table files a gathered batch's rewrites read in the driver (see :func:`_run_rewrites`).
DRIVER_REWRITE_BYTES = 64 << 20
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
    #: Its deletion vector's descriptor (None: none): the rows at the positions it deletes are
    #: not the table's; no retraction finds them, and a rewrite of the file leaves them out.
    deletion_vector: dict | None = None
    #: Its add action as the log holds it; given where retractions are marked in deletion vectors.
    add: dict | None = None


@dataclass
class Rewrites:
    files: list[StagedFile]
    removes: list[tuple[str, int]]
    #: Retraction updates (rows of the batch) and copies deleted.
    retractions: int
    deleted: int
    #: The deletion vector of each of ``removes`` that has one.
    removed_deletion_vectors: dict[str, dict] = field(default_factory=dict)
    #: Marking only: the add actions of ``removes`` again, each under its new deletion vector
    #: (none for a file left without rows).
    marked: list[dict] = field(default_factory=list)


def rewrite_retractions(spark: SparkSession, retractions: DataFrame, table_files: list[TableFile],
                        target: str, prefix: str, columns: list[str], prune_column: str,
                        mark: bool = False) -> Rewrites:
    """Stage the rewrites that take ``retractions`` (ok updates with negative diffs, the view's
    ``columns``) out of ``table_files``, or with ``mark`` the deletion vectors that do; see the
    module doc."""
    counts = retractions.groupBy(prune_column).agg(F.count(F.lit(1)).alias("n"), F.sum(-F.col(DIFF)).alias("k"))
    gathered = counts.limit(_MAX_PRUNE_VALUES + 1).collect()
    if not gathered:
        return Rewrites([], [], 0, 0)
    if len(gathered) > _MAX_PRUNE_VALUES:
        row = counts.agg(F.sum("n"), F.sum("k"), F.min(prune_column), F.max(prune_column),
                         F.max(F.col(prune_column).isNull().cast("int"))).first()
        updates, copies = row[0], row[1]
        candidates = files_in_ranges(table_files, [(row[2], row[3])], bool(row[4]))
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
    removes = [(f.path, f.size) for f in touched]
    if mark:
        marked = _marked(target, touched, {f.path: by_file[os.path.basename(unquote(f.path))] for f in touched})
        log.info("retracting %d copies (%d updates): %d of %d files read, %d marked in deletion vectors",
                 copies, updates, len(candidates), len(table_files), len(touched))
        return Rewrites([], removes, updates, copies, _deletion_vectors(touched), marked)
    staged = _rewrite(spark, touched, by_file, target, prefix)
    log.info("retracting %d copies (%d updates): %d of %d files read, %d rewritten", copies, updates,
             len(candidates), len(table_files), len(touched))
    return Rewrites(staged, removes, updates, copies, _deletion_vectors(touched))


def _prune_by_values(files: list[TableFile], values: list) -> list[TableFile]:
    """The files whose statistics allow one of ``values`` (None: a null); a file without them, or
    with ones that do not compare, is kept."""
    has_null = any(v is None for v in values)
    try:
        present = sorted(v for v in values if v is not None)
    except TypeError:
        return files
    kept = []
    for f in files:
        low, high = bounds(f.low, f.high)
        if has_null and (f.nulls is None or f.nulls > 0):
            kept.append(f)
            continue
        try:
            i = 0 if low is None else bisect.bisect_left(present, low)
            if i < len(present) and (high is None or present[i] <= high):
                kept.append(f)
        except TypeError:
            kept.append(f)
    return kept


def files_in_ranges(files: list[TableFile], ranges: list[tuple], has_null: bool) -> list[TableFile]:
    """The files whose statistics allow a value in one of the closed ``ranges`` (a bound None:
    any value), or a null where ``has_null``; a file without them, or with ones that do not
    compare, is kept (where anything is asked)."""
    kept = []
    for f in files:
        try:
            meets = overlaps(*bounds(f.low, f.high), ranges)
        except TypeError:
            meets = True
        if meets or (has_null and (f.nulls is None or f.nulls > 0)):
            kept.append(f)
    return kept


def _deletions(spark: SparkSession, retractions: DataFrame, files: list[TableFile], target: str,
               columns: list[str], updates: int) -> list[tuple[str, int]]:
    """(file name, row position) of the copies to delete: the first `k` of each retracted row."""
    schema = T.StructType([f for f in retractions.schema.fields if f.name in columns])
    rows = live_rows(spark, target, {f.path: f.deletion_vector for f in files}, schema, positions=True
                     ).withColumnRenamed(FILE, "_mv_file").withColumnRenamed(ROW, "_mv_pos")
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
    jobs = [(f.path, deletions[os.path.basename(unquote(f.path))] + _deleted_already(target, f)) for f in files]
    frame = spark.createDataFrame(jobs, "path STRING, positions ARRAY<BIGINT>").repartition(len(jobs))

    def rewrite(batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        fs, root = storage.filesystem(target)
        for batch in batches:
            for index, (path, positions) in enumerate(zip(batch.column("path").to_pylist(),
                                                          batch.column("positions").to_pylist())):
                table = storage.retrying(f"reading {path}", _read, fs, storage.join(root, unquote(path)))
                row = _written_without(target, f"{prefix}-rw{context.partitionId():05d}-{index}-"
                                               f"{context.attemptNumber()}.parquet", table, positions)
                if row is not None:
                    yield pa.RecordBatch.from_pydict({**row, "errors": pa.array([False]),
                                                      "updates": pa.array([0], pa.int64())})

    rows = frame.mapInArrow(rewrite, _FILE_LIST_SCHEMA).collect()
    return [StagedFile(r.path, r.size, r.num_records, r.stats) for r in rows]


def _deletion_vectors(files: list[TableFile]) -> dict[str, dict]:
    return {f.path: f.deletion_vector for f in files if f.deletion_vector}


def _marked(target: str, files: list[TableFile], deletions: dict[str, list[int]]) -> list[dict]:
    """The add actions of ``files`` under new deletion vectors that also mark their rows at
    ``deletions`` (by path) deleted, the vectors' files written (no add for a file left without
    rows: its remove alone takes it out)."""
    now = int(time.time() * 1000)
    marked = []
    for f in files:
        if f.add is None:
            raise ValueError(f"no add action of {f.path} to mark its deleted rows in (TableFile.add)")
        marked += [a["add"] for a in delete_rows(target, f.add, deletions[f.path], now) if "add" in a]
    return marked


def _deleted_already(target: str, file: TableFile) -> list[int]:
    """The positions of ``file`` its deletion vector deletes (none without one)."""
    return read_dv(target, file.deletion_vector).tolist() if file.deletion_vector else []


def _read(fs, path: str) -> pa.Table:
    with fs.open_input_file(path) as f:
        return pq.read_table(f)


#: The multiplicity of each retracted row in a gathered retraction table.
COPIES = "_mv_k"
_NAN = ("mvsink-nan",)


def rewrite_gathered(spark: SparkSession, retractions: pa.Table, inserts: pa.Table,
                     table_files: list[TableFile], target: str, prefix: str,
                     prune_column: str, order_by: str | None, mark: bool = False) -> tuple[Rewrites, pa.Table]:
    """Stage the rewrites that take ``retractions`` (the view's columns and :data:`COPIES`, held
    on the driver) out of ``table_files``, folding ``inserts`` (plain rows) into the rewritten
    files, each insert into the file whose range of the prune column it falls in; with ``mark``,
    the deletion vectors that take them out instead, folding nothing; see the module doc. A
    rewritten file holds its rows in ``order_by``'s order. Returns the rewrites and the inserts no
    rewrite took."""
    copies = retractions.column(COPIES).to_pylist()
    candidates = _prune_by_values(table_files, list(set(retractions.column(prune_column).to_pylist())))
    if not candidates:
        raise RetractionNotFound(f"no file of the table can hold the {sum(copies)} row copies the batch "
                                 "retracts; the read-back is behind the table")
    if mark:
        return _mark_gathered(spark, retractions, candidates, len(table_files), target, prefix, prune_column), inserts
    shares = _shares(inserts, candidates, prune_column)
    outcomes, quotas = _search(spark, candidates, retractions, shares, target, prefix, prune_column, order_by, False)
    touched = [f for f in candidates if outcomes[f.path].rewritten]
    unplaced = [shares[i] for i, f in enumerate(candidates) if not outcomes[f.path].rewritten]
    log.info("retracting %d copies (%d updates): %d of %d files read, %d rewritten, %d inserted rows "
             "folded into them%s", sum(copies), retractions.num_rows, len(candidates), len(table_files),
             len(touched), inserts.num_rows - sum(s.num_rows for s in unplaced),
             f", {len(quotas)} rewritten again to keep k copies" if quotas else "")
    staged = [outcomes[f.path].file for f in touched if outcomes[f.path].file]
    rest = pa.concat_tables(unplaced) if unplaced else inserts.slice(0, 0)
    removes = [(f.path, f.size) for f in touched]
    return Rewrites(staged, removes, retractions.num_rows, sum(copies), _deletion_vectors(touched)), rest


def _search(spark: SparkSession, candidates: list[TableFile], retractions: pa.Table, shares: list[pa.Table],
            target: str, prefix: str, prune_column: str, order_by: str | None,
            mark: bool) -> tuple[dict[str, _Outcome], dict[str, dict[int, int]]]:
    """The retractions' copies found in ``candidates`` and the files holding them rewritten (or,
    with ``mark``, their positions), `k` copies of each in all: each file's outcome, and the
    quotas of the files done again where a row's copies spread over several."""
    copies = retractions.column(COPIES).to_pylist()
    outcomes = _run_rewrites(spark, candidates, retractions, shares, {}, target, prefix, prune_column, order_by, mark)
    matched = [0] * len(copies)
    for outcome in outcomes.values():
        for r, n in outcome.matched.items():
            matched[r] += n
    missing = [r for r, k in enumerate(copies) if matched[r] < k]
    if missing:
        _delete_staged(target, [o.file for o in outcomes.values() if o.file])
        raise RetractionNotFound(
            f"the table's files hold fewer copies than the batch retracts of {len(missing)} rows "
            f"(first: {_row_text(retractions, missing[0])}); the read-back is behind the table")
    quotas = _quotas(candidates, outcomes, copies)
    if quotas:
        _delete_staged(target, [outcomes[path].file for path in quotas if outcomes[path].file])
        redone = [f for f in candidates if f.path in quotas]
        outcomes.update(_run_rewrites(spark, redone, retractions,
                                      [shares[candidates.index(f)] for f in redone], quotas, target,
                                      prefix + "-q", prune_column, order_by, mark))
    return outcomes, quotas


def _mark_gathered(spark: SparkSession, retractions: pa.Table, candidates: list[TableFile], table_files: int,
                   target: str, prefix: str, prune_column: str) -> Rewrites:
    """:func:`rewrite_gathered` with ``mark``: the positions of the retractions' copies, first by
    their prune value alone (:func:`_settled_by_prune_value`), the rest by comparing whole rows
    (:func:`_search`), marked deleted in deletion vectors."""
    copies = retractions.column(COPIES).to_pylist()
    positions, unsettled = _settled_by_prune_value(target, candidates, retractions, prune_column)
    if unsettled:
        rest = retractions.take(pa.array(unsettled, pa.int64()))
        files = _prune_by_values(candidates, list(set(rest.column(prune_column).to_pylist())))
        if not files:
            raise RetractionNotFound(f"no file of the table can hold the {rest.num_rows} rows the batch "
                                     "retracts; the read-back is behind the table")
        none = rest.drop_columns([COPIES]).slice(0, 0)
        outcomes, _ = _search(spark, files, rest, [none] * len(files), target, prefix, prune_column, None, True)
        for path, outcome in outcomes.items():
            if outcome.dropped:
                positions.setdefault(path, []).extend(outcome.dropped)
    touched = [f for f in candidates if positions.get(f.path)]
    log.info("retracting %d copies (%d updates): %d of %d files read (the prune column), %d updates compared "
             "whole, %d files marked in deletion vectors", sum(copies), retractions.num_rows, len(candidates),
             table_files, len(unsettled), len(touched))
    return Rewrites([], [(f.path, f.size) for f in touched], retractions.num_rows, sum(copies),
                    _deletion_vectors(touched), _marked(target, touched, positions))


def _settled_by_prune_value(target: str, files: list[TableFile], retractions: pa.Table,
                            prune_column: str) -> tuple[dict[str, list[int]], list[int]]:
    """The copies of the retractions that their prune value alone finds, by reading only that
    column of ``files``: where one retraction (`k` copies) has a prune value and ``files`` hold
    exactly `k` live rows with it, those rows are its copies. (A file's rows never change under
    its logical name, and the buffer retracts `k` copies of a row only where the files the
    read-back read, these, hold at least `k`.) Returns their positions by file path, and the
    indexes of the retractions left to compare whole (every one where the column is a float: NaN)."""
    values = retractions.column(prune_column)
    if pa.types.is_floating(values.type) or pa.types.is_nested(values.type):
        return {}, list(range(retractions.num_rows))
    groups = pc.unique(values)
    group_of = pc.index_in(values, value_set=groups, skip_nulls=False).to_numpy(zero_copy_only=False)
    copies = np.asarray(retractions.column(COPIES).to_pylist(), dtype=np.int64)
    wanted = np.bincount(group_of, weights=copies, minlength=len(groups))
    alone = np.bincount(group_of, minlength=len(groups)) == 1
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    held = np.zeros(len(groups))
    fs, root = storage.filesystem(target)
    for f in files:
        keys = storage.retrying(f"reading {f.path}", _read_column, fs, storage.join(root, unquote(f.path)),
                                prune_column)
        try:
            keys = keys.cast(values.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise RetractionNotFound(f"the table file {f.path} does not hold the view's column {prune_column} "
                                     f"as stored ({values.type}): {exc}") from exc
        group = pc.index_in(keys, value_set=groups, skip_nulls=False)
        hit = pc.is_valid(group).to_numpy(zero_copy_only=False)
        at, group = np.nonzero(hit)[0], group.filter(pa.array(hit)).to_numpy(zero_copy_only=False)
        if f.deletion_vector:
            live = ~np.isin(at, _deleted_already(target, f))
            at, group = at[live], group[live]
        found[f.path] = (group, at)
        held += np.bincount(group, minlength=len(groups))
    settled = alone & (held == wanted)
    positions = {path: at[settled[group]].tolist() for path, (group, at) in found.items()}
    return ({path: p for path, p in positions.items() if p},
            [r for r in range(retractions.num_rows) if not settled[group_of[r]]])


def _read_column(fs, path: str, column: str) -> pa.ChunkedArray:
    with fs.open_input_file(path) as f:
        return pq.read_table(f, columns=[column]).column(0)


@dataclass
class _Outcome:
    """What a rewrite task did to one file."""

    #: The staged rewrite (None: nothing survived and nothing was folded in, or not rewritten).
    file: StagedFile | None
    #: Whether the file goes (it held a deleted copy).
    rewritten: bool
    #: Retraction index -> copies of that row the file holds.
    matched: dict[int, int]
    #: Retraction index -> copies deleted.
    deleted: dict[int, int]
    #: The positions of the copies deleted, where they are marked rather than rewritten.
    dropped: list[int] = field(default_factory=list)


def _shares(inserts: pa.Table, files: list[TableFile], prune_column: str) -> list[pa.Table]:
    """``inserts`` cut into one share per file of ``files``: a row goes to the last file (by the
    low bound of its prune column) whose range starts at or below the row's value, nulls and
    values below every range to the first, so files that hold disjoint ranges keep them as far as
    the inserts allow. Where a file's bounds are unknown or cannot be compared with the values:
    consecutive, nearly equal shares."""
    n = len(files)
    lows = [f.low for f in files]
    if inserts.num_rows and None not in lows:
        try:
            order = sorted(range(n), key=lambda i: lows[i])
            starts = [lows[i] for i in order]
            owners = np.fromiter((order[max(0, bisect.bisect_right(starts, v) - 1)] if v is not None else order[0]
                                  for v in inserts.column(prune_column).to_pylist()), dtype=np.int64,
                                 count=inserts.num_rows)
            return [inserts.filter(pa.array(owners == i)) for i in range(n)]
        except TypeError:
            pass
    edges = [inserts.num_rows * i // n for i in range(n + 1)]
    return [inserts.slice(lo, hi - lo) for lo, hi in zip(edges, edges[1:])]


def _quotas(files: list[TableFile], outcomes: dict[str, _Outcome], copies: list[int]) -> dict[str, dict[int, int]]:
    """Where the first pass deleted more than `k` copies of a row (its copies spread over several
    files, each deleting up to `k`): the copies each such file must delete instead, the first `k`
    in file order; only the files whose deletions change."""
    deleted = [0] * len(copies)
    for outcome in outcomes.values():
        for r, n in outcome.deleted.items():
            deleted[r] += n
    over = {r for r, k in enumerate(copies) if deleted[r] > k}
    if not over:
        return {}
    left = {r: copies[r] for r in over}
    quotas: dict[str, dict[int, int]] = {}
    for f in files:
        outcome = outcomes[f.path]
        for r in over & outcome.matched.keys():
            take = min(left[r], outcome.matched[r])
            left[r] -= take
            if take != outcome.deleted.get(r, 0):
                quotas.setdefault(f.path, {})[r] = take
    return quotas


_OUTCOME_SCHEMA = T.StructType(_FILE_LIST_SCHEMA.fields + [
    T.StructField("source", T.StringType()),
    T.StructField("rewritten", T.BooleanType()),
    T.StructField("matched", T.ArrayType(T.LongType())),
    T.StructField("deleted", T.ArrayType(T.LongType())),
    T.StructField("dropped", T.ArrayType(T.LongType())),
])


def _run_rewrites(spark: SparkSession, files: list[TableFile], retractions: pa.Table, shares: list[pa.Table],
                  quotas: dict[str, dict[int, int]], target: str, prefix: str,
                  prune_column: str, order_by: str | None, mark: bool) -> dict[str, _Outcome]:
    """Per file (:func:`_rewrite_file`): find the retracted rows' copies in it, and where it holds
    one, rewrite it without the copies to delete and with its share of the inserts (``mark``:
    only find the positions to delete). Files of at
    most :data:`DRIVER_REWRITE_BYTES` in all are rewritten here, one after the other (a Spark job
    costs more than reading them); more by one Spark task each. Returns each file's outcome."""
    jobs = [(f.path, i, sorted((quotas.get(f.path) or {}).items()), _deleted_already(target, f))
            for i, f in enumerate(files)]
    if sum(f.size for f in files) <= DRIVER_REWRITE_BYTES:
        fs, root = storage.filesystem(target)
        return {path: _rewrite_file(fs, root, target, f"{prefix}-rwd-{share}.parquet", path, retractions,
                                    shares[share], dict(quota), prune_column, order_by, gone, mark)
                for path, share, quota, gone in jobs}
    payload = spark.sparkContext.broadcast(_ipc([retractions] + shares))
    frame = spark.createDataFrame([(path, share, [list(q) for q in quota], gone) for path, share, quota, gone in jobs],
                                  "path STRING, share INT, quotas ARRAY<ARRAY<BIGINT>>, gone ARRAY<BIGINT>"
                                  ).repartition(len(jobs))
    out_schema = to_arrow_schema(_OUTCOME_SCHEMA)

    def rewrite(batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        tables = _from_ipc(payload.value)
        fs, root = storage.filesystem(target)
        for batch in batches:
            for path, share, quota, gone in zip(*(batch.column(c).to_pylist()
                                                   for c in ("path", "share", "quotas", "gone"))):
                name = f"{prefix}-rw{context.partitionId():05d}-{share}-{context.attemptNumber()}.parquet"
                outcome = _rewrite_file(fs, root, target, name, path, tables[0], tables[1 + share],
                                        dict(quota or []), prune_column, order_by, gone, mark)
                staged = outcome.file
                yield pa.RecordBatch.from_pydict({
                    "path": pa.array([staged and staged.path], pa.string()),
                    "size": pa.array([staged and staged.size], pa.int64()),
                    "num_records": pa.array([staged and staged.num_records], pa.int64()),
                    "stats": pa.array([staged and staged.stats], pa.string()),
                    "errors": pa.array([False]), "updates": pa.array([0], pa.int64()),
                    "source": pa.array([path]), "rewritten": pa.array([outcome.rewritten]),
                    "matched": pa.array([_flat(outcome.matched)], pa.list_(pa.int64())),
                    "deleted": pa.array([_flat(outcome.deleted)], pa.list_(pa.int64())),
                    "dropped": pa.array([outcome.dropped], pa.list_(pa.int64())),
                }, schema=out_schema)

    try:
        rows = frame.mapInArrow(rewrite, _OUTCOME_SCHEMA).collect()
    finally:
        payload.destroy()
    return {r.source: _Outcome(StagedFile(r.path, r.size, r.num_records, r.stats) if r.path else None,
                               r.rewritten, _unflat(r.matched), _unflat(r.deleted), list(r.dropped or []))
            for r in rows}


def _rewrite_file(fs, root: str, target: str, name: str, path: str, wanted: pa.Table, given: pa.Table,
                  limits: dict[int, int], prune_column: str, order_by: str | None, gone: list[int],
                  mark: bool = False) -> _Outcome:
    """The table file ``path``: the copies in it of each row of ``wanted`` (the retractions, with
    their :data:`COPIES`), and where it holds one, its rewrite staged as ``name`` without up to `k`
    copies of each (in file order; ``limits``: a row's quota instead) and with ``given`` (its share
    of the inserts), in ``order_by``'s order; with ``mark``, no rewrite, the positions of those
    copies instead. The rows at ``gone`` (its deletion vector's positions) are none of the
    table's: never a copy, and left out of the rewrite."""
    stored = wanted.schema.remove(wanted.schema.get_field_index(COPIES))
    copies = wanted.column(COPIES).to_pylist()
    rows = storage.retrying(f"reading {path}", _read, fs, storage.join(root, unquote(path)))
    rows = _conform(rows, stored, path)
    positions = _copies(rows, wanted, prune_column)
    if gone:
        already = set(gone)
        positions = {r: kept for r, p in positions.items() if (kept := [i for i in p if i not in already])}
    drop = {r: p[:limits.get(r, copies[r])] for r, p in positions.items()}
    drop = {r: p for r, p in drop.items() if p}
    matched, deleted = {r: len(p) for r, p in positions.items()}, {r: len(p) for r, p in drop.items()}
    if mark:
        return _Outcome(None, bool(drop), matched, deleted,
                        sorted(p for ps in drop.values() for p in ps))
    staged = None
    if drop:
        row = _written_without(target, name, rows, [p for ps in drop.values() for p in ps] + list(gone), given,
                               order_by)
        if row is not None:
            staged = StagedFile(*(row[c][0].as_py() for c in ("path", "size", "num_records", "stats")))
    return _Outcome(staged, bool(drop), matched, deleted)


def _written_without(target: str, name: str, rows: pa.Table, positions: list[int], given: pa.Table | None = None,
                     order_by: str | None = None) -> dict | None:
    """``rows`` without those at ``positions``, with ``given`` after them, in ``order_by``'s order,
    staged as the file ``name``: its file-list row (None: no rows)."""
    keep = np.ones(rows.num_rows, dtype=bool)
    keep[np.asarray(positions, dtype=np.int64)] = False
    kept = rows.filter(pa.array(keep))
    if given is not None:
        kept = sorted_rows(pa.concat_tables([kept, given]), order_by)
    writer = _FileWriter(target, name)
    try:
        for piece in kept.to_batches():
            writer.write(piece)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


def _flat(counts: dict[int, int]) -> list[int]:
    return [x for item in sorted(counts.items()) for x in item]


def _unflat(flat: list[int]) -> dict[int, int]:
    return dict(zip(flat[::2], flat[1::2]))


def _ipc(tables: list[pa.Table]) -> list[bytes]:
    out = []
    for table in tables:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        out.append(sink.getvalue().to_pybytes())
    return out


def _from_ipc(blobs: list[bytes]) -> list[pa.Table]:
    return [pa.ipc.open_stream(blob).read_all() for blob in blobs]


def _conform(rows: pa.Table, schema: pa.Schema, path: str) -> pa.Table:
    """A file's rows in the view's stored columns and types (a foreign writer's file may use
    other Arrow types for them)."""
    try:
        return rows.select(schema.names).cast(schema)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise RetractionNotFound(f"the table file {path} does not hold the view's columns as stored "
                                 f"({schema}): {exc}") from exc


def _copies(rows: pa.Table, wanted: pa.Table, prune_column: str) -> dict[int, list[int]]:
    """Retraction index -> positions in ``rows`` of that row's copies, in file order.

    Candidates are narrowed column by column with a vectorized membership test (nulls match
    nulls), then compared whole, null equal to null and NaN to NaN as Spark's null-safe equality
    has it: column by column against the one retraction of their prune value where no two
    retractions share one (:func:`_copies_by_prune_value`), else in Python."""
    columns = [c for c in wanted.column_names if c != COPIES]
    order = [prune_column] + [c for c in columns if c != prune_column]
    positions = np.arange(rows.num_rows)
    for column in order:
        if len(positions) <= 2 * wanted.num_rows + 64:
            break
        try:
            mask = pc.is_in(rows.column(column).take(positions), value_set=pc.unique(wanted.column(column)),
                            skip_nulls=False)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            continue
        positions = positions[mask.to_numpy(zero_copy_only=False)]
    prune_values = wanted.column(prune_column)
    if pc.count_distinct(prune_values, mode="all").as_py() == wanted.num_rows:
        try:
            return _copies_by_prune_value(rows, wanted, columns, prune_column, positions)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            pass  # a type the kernels cannot compare: whole rows in Python
    index = {}
    for r, key in enumerate(_keys(wanted.select(columns))):
        if index.setdefault(key, r) != r:
            raise ValueError(f"the batch retracts the row {_row_text(wanted, r)} twice: it is not consolidated")
    found: dict[int, list[int]] = {}
    for position, key in zip(positions.tolist(), _keys(rows.select(columns).take(positions))):
        r = index.get(key)
        if r is not None:
            found.setdefault(r, []).append(position)
    return found


def _copies_by_prune_value(rows: pa.Table, wanted: pa.Table, columns: list[str], prune_column: str,
                           positions: np.ndarray) -> dict[int, list[int]]:
    """:func:`_copies` where each retraction has a prune value of its own (as a keyed view's
    retractions have): each candidate is paired with the retraction of its prune value, and the
    pairs are compared column by column with Arrow's kernels."""
    candidates = rows.select(columns).take(positions)
    paired = pc.index_in(candidates.column(prune_column), value_set=wanted.column(prune_column), skip_nulls=False)
    has_pair = pc.is_valid(paired).to_numpy(zero_copy_only=False)
    positions, candidates = positions[has_pair], candidates.filter(pa.array(has_pair))
    retraction = paired.filter(pa.array(has_pair)).to_numpy(zero_copy_only=False)
    mine = wanted.select(columns).take(pa.array(retraction))
    same = np.ones(len(positions), dtype=bool)
    for column in columns:
        if column != prune_column and len(positions):
            same &= _equal_null_safe(candidates.column(column), mine.column(column))
    found: dict[int, list[int]] = {}
    for position, r in zip(positions[same].tolist(), retraction[same].tolist()):
        found.setdefault(r, []).append(position)
    return found


def _equal_null_safe(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    """``a == b`` element by element, null equal to null and NaN to NaN (Spark's ``<=>``); raises
    Arrow's not-implemented error for types its kernels cannot compare (lists, structs, maps)."""
    if pa.types.is_nested(a.type):
        raise pa.ArrowNotImplementedError(f"no vectorized comparison of {a.type}")
    same = pc.fill_null(pc.equal(a, b), False)
    same = pc.or_(same, pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(a.type):
        same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return same.to_numpy(zero_copy_only=False)


def _keys(table: pa.Table):
    """Each row of ``table`` as a hashable tuple (lists and structs as tuples, NaN as a marker)."""
    return zip(*([_frozen(v) for v in table.column(c).to_pylist()] for c in table.column_names))


def _frozen(value):
    if isinstance(value, float) and value != value:
        return _NAN
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    return value


def _row_text(table: pa.Table, r: int) -> str:
    return str({c: table.column(c)[r].as_py() for c in table.column_names if c != COPIES})


def _delete_staged(target: str, files: list[StagedFile]) -> None:
    fs, root = storage.filesystem(target)
    for f in files:
        storage.retrying(f"deleting staged file {f.path}", _delete_if_exists, fs, storage.join(root, f.path))
