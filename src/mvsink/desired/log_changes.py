"""A source's changes read from its Delta log: its commits' change data files, else their added and
removed data files.

A commit that wrote change data files (``cdc`` actions: the change data feed was on and the
operation rewrote rows) has its changes in them, each row with its ``_change_type``; the protocol
has change data readers read such a commit from those files only. Any other commit's change is
exact in the log too: the rows of the data files it added at +1 and of the files it removed at -1;
consolidated, that is the difference of the table's contents after and before the commit (an
UPDATE that rewrites a file removes its old rows and adds its new ones; the rows it kept cancel,
and are cancelled as they are read: :func:`log_changes`).
An ``UPDATE`` by delta-rs is read from its data files even so: its change data files leave rows
out (:func:`_change_data_holds_the_change`).
Actions with ``dataChange`` false (OPTIMIZE, compaction) move rows between files without changing
the contents and are skipped. The work follows the touched files, not the table, and Spark reads
them as plain Parquet: no change data feed query for Delta to plan.

This holds for a range of versions only where every file's rows are the table's rows: no added or
removed file read carries a deletion vector (its deleted rows are still in the file), the table
has no column mapping at the version before the range nor in it (its files' column names are not
the table's), every metadata a commit in the range sets has the columns of the version before,
and every action has its partition values (a partition column is not in the files; a remove
leaves out a null one). The schema before a range is Delta's, unless the last range read ended
there (then it is known: a version's metadata never changes). Otherwise
:func:`log_changes` raises :class:`LogChangesUnavailable` before reading any file, and the caller
reads the change data feed or the snapshots instead. A data file that is gone (VACUUM) fails the
read with Spark's ``PATH_NOT_FOUND``, which :func:`mvsink.desired.changes.unreadable` tells apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, lru_cache, reduce
from typing import Callable, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink import storage
from mvsink.desired.arrow_plan import arrow_schema
from mvsink.table import file_uri, log_actions, spark_uri
from mvsink.updates import DIFF, TIME, consolidate, groupable, unit_diffs

_R = TypeVar("_R")
_NO_COLUMN_MAPPING = ("none", None)
#: The actions a commit's changes are read from, each with its rows' diff (None: each row's own).
_CHANGE_DATA, _DATA = (("cdc", None),), (("add", 1), ("remove", -1))
#: The column of a change data file (and of the change data feed) that says what its row is.
CHANGE_TYPE = "_change_type"


#: The most bytes of a range's added and removed data files consolidated in this process
#: (:func:`_consolidated_here`); Spark consolidates a larger rewrite.
MOST_BYTES_HERE = 128 * 2**20
#: Spark's types of the columns a rewrite consolidated in this process may have (Arrow groups them).
#: (Not timestamps: a file's may be INT96, read by Arrow in another unit.)
_FLAT_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType,
               T.StringType, T.BinaryType, T.BooleanType, T.DateType)


class LogChangesUnavailable(Exception):
    """The data files of a range of versions do not hold the table's rows as they are."""


@cache
def change_diff() -> Column:
    """A change row's diff from its :data:`CHANGE_TYPE`: +1 inserted or post-image, -1 deleted or
    pre-image (built once)."""
    return (F.when(F.col(CHANGE_TYPE).isin("insert", "update_postimage"), F.lit(1))
            .when(F.col(CHANGE_TYPE).isin("delete", "update_preimage"), F.lit(-1)).cast("long").alias(DIFF))


def log_changes(spark: SparkSession, path: str, spans: list[tuple[int, int, int]], small: bool = False) -> DataFrame:
    """The changes of the Delta table at ``path`` over ``spans`` (``(time, first version, last
    version)``, consecutive) from its log, as updates: the table's columns, each change's time
    (its commit's span) and diff (a change data file's row by its change type; else +1 added
    file's row, -1 removed file's row). Where a time both removes and adds data files (a
    rewrite: the rows a rewritten file kept are in both), the data files' rows are consolidated
    (in one task where the change is ``small``: no shuffle) and given as rows of diff 1 or -1,
    so that a step holds and joins the rows that changed, not every row of the files touched;
    change data files' rows are not."""
    first, last = spans[0][1], spans[-1][2]
    before = _schema_before(spark, path, first)
    listed = change_files(path, spans, before)
    schema = _schema(spark, path, last) if listed.metadata_changed else before
    _remember(path, last, schema)
    columns = [f.name for f in schema.fields]
    data_schema = T.StructType([f for f in schema.fields if f.name not in listed.partition_columns])

    def read(kinds: tuple) -> list[DataFrame]:
        """The rows of the listed files whose diff is among ``kinds``, by Spark."""
        return [_rows(spark, uris, data_schema, schema, {c: dict(values).get(c) for c in listed.partition_columns},
                      time, diff).select(*columns, TIME, DIFF)
                for (time, diff, values), uris in listed.files.items() if diff in kinds]

    if not listed.files:
        updates = T.StructType([*schema.fields, T.StructField(TIME, T.LongType()), T.StructField(DIFF, T.LongType())])
        return spark.createDataFrame([], updates)
    rewritten = {time for time, diff, _ in listed.files if diff == -1} & {time for time, diff, _ in listed.files if diff == 1}
    if not rewritten or not all(groupable(f.dataType) for f in schema.fields):
        return reduce(DataFrame.unionByName, read((None, 1, -1)))
    consolidated = None
    if (not listed.partition_columns and listed.data_bytes is not None and listed.data_bytes <= MOST_BYTES_HERE
            and all(isinstance(f.dataType, _FLAT_TYPES) for f in schema.fields)):
        data = {key: uris for key, uris in listed.files.items() if key[1] is not None}
        consolidated, rows = _consolidated_here(spark, data, schema) or (None, None)
        if rows is not None and len(data) == len(listed.files):
            _consolidated_rows[(path, first, last)] = rows
            while len(_consolidated_rows) > _SCHEMAS_KEPT:
                del _consolidated_rows[next(iter(_consolidated_rows))]
    if consolidated is None:
        data = reduce(DataFrame.unionByName, read((1, -1)))
        consolidated = unit_diffs(consolidate(data.coalesce(1) if small else data))
    return reduce(DataFrame.unionByName, read((None,)), consolidated)


def consolidated_rows(path: str, first: int, last: int) -> int | None:
    """How many rows the changes of versions ``first`` to ``last`` of the table at ``path`` were,
    where :func:`log_changes` read them last, a rewrite consolidated in this process (None: not so)."""
    return _consolidated_rows.get((path, first, last))


def _consolidated_here(spark: SparkSession, files: dict[tuple[int, int, tuple], list[str]], schema: T.StructType
                       ) -> tuple[DataFrame, int] | None:
    """The rows of the data ``files`` (each at its time and diff; the table unpartitioned, its
    columns ``schema``'s, of :data:`_FLAT_TYPES`) consolidated in this process with Arrow, as
    rows of diff 1 or -1, a local relation, and how many; None where a file's column does not
    read as its type (Spark reads them then). Rows cancel only where Arrow has them equal, value for value,
    which Spark has equal too (a pair it would cancel and Arrow keeps is consolidated after).
    A rewrite's kept rows are cancelled first (:func:`_cancel_kept_rows`), so that only the rest
    is grouped."""
    types = arrow_schema(schema)
    read: dict[tuple[int, int], list[pa.Table]] = {}
    try:
        for (time, diff, _), uris in files.items():
            read.setdefault((time, diff), []).extend(_file_rows(uri, types, keep=diff == 1) for uri in uris)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    parts = []
    for time in sorted({time for time, _ in read}):
        removed, added = _cancel_kept_rows(read.get((time, -1), []), read.get((time, 1), []))
        for diff, tables in ((-1, removed), (1, added)):
            for rows in tables:
                stamps = [pa.repeat(pa.scalar(value, pa.int64()), rows.num_rows) for value in (time, diff)]
                parts.append(pa.Table.from_arrays([*rows.columns, *stamps], names=[*types.names, TIME, DIFF]))
    names = [*types.names, TIME]
    summed = pa.concat_tables(parts).group_by(names, use_threads=False).aggregate([(DIFF, "sum")])
    summed = summed.rename_columns([*names, DIFF])
    changed = summed.filter(pc.not_equal(summed.column(DIFF), 0))
    counts = pc.abs(changed.column(DIFF)).to_numpy()
    units = changed.take(pa.array(np.repeat(np.arange(len(counts)), counts)))
    units = units.set_column(len(names), DIFF, pc.cast(pc.sign(units.column(DIFF)), pa.int64()))
    updates = T.StructType([*schema.fields, T.StructField(TIME, T.LongType()), T.StructField(DIFF, T.LongType())])
    return spark.createDataFrame(units.combine_chunks(), schema=updates), units.num_rows  # one batch: see local_relation


#: The most bytes of added files' rows kept in this process for the next range, which mostly removes them.
MOST_BYTES_KEPT = 256 * 2**20
#: The rows of the added files read last, by ``(URI, Arrow schema)``, oldest first (a data file never
#: changes once written), at most :data:`MOST_BYTES_KEPT` in all.
_kept_files: dict[tuple[str, pa.Schema], pa.Table] = {}


def _file_rows(uri: str, types: pa.Schema, keep: bool) -> pa.Table:
    """The rows of the data file at ``uri`` in the columns ``types`` (one missing from the file
    is null), cast safely (raising :class:`pyarrow.ArrowInvalid` where a value does not fit);
    ``keep``: kept for the next read of the file (:data:`_kept_files`)."""
    rows = _kept_files.pop((uri, types), None)
    if rows is None:
        fs, path = storage.filesystem(uri)
        with fs.open_input_file(path) as f:
            read = pq.ParquetFile(f).read()
        rows = pa.Table.from_arrays(
            [pc.cast(read.column(field.name), field.type, safe=True) if field.name in read.column_names
             else pa.nulls(read.num_rows, field.type) for field in types], names=types.names)
    if keep and rows.nbytes <= MOST_BYTES_KEPT:
        _kept_files[uri, types] = rows
        while sum(kept.nbytes for kept in _kept_files.values()) > MOST_BYTES_KEPT:
            del _kept_files[next(iter(_kept_files))]
    return rows


#: The rows of a removed and an added file compared to tell whether the added file rewrote the
#: removed one; fewer rows left on a side are left to grouping.
_PROBE_ROWS = 1024
#: The columns of the removed rows tried for one whose values are unique (:func:`_cancel_by_unique_column`).
_UNIQUE_TRIES = 3


def _cancel_kept_rows(removed: list[pa.Table], added: list[pa.Table]) -> tuple[list[pa.Table], list[pa.Table]]:
    """The ``removed`` and ``added`` files' rows (of one time) without pairs of equal rows, one
    removed and one added, found where a rewrite keeps them: at the same position of a removed
    file and of the added file that rewrote it (:func:`_cancel_by_position`: an UPDATE), then by
    a column whose values are unique among the removed rows left (:func:`_cancel_by_unique_column`:
    a DELETE, a MERGE, files packed together). Dropping a row at -1 and an equal row at +1 of one
    time is consolidation, whatever the files were: a pair missed is only a row left to group."""
    removed, added = _cancel_by_position(removed, added)
    left_removed, left_added = (pa.concat_tables(tables) if tables else None for tables in (removed, added))
    if left_removed is None or left_added is None or min(left_removed.num_rows, left_added.num_rows) <= _PROBE_ROWS:
        return removed, added
    cancelled = _cancel_by_unique_column(left_removed, left_added)
    return (removed, added) if cancelled is None else ([cancelled[0]], [cancelled[1]])


def _cancel_by_position(removed: list[pa.Table], added: list[pa.Table]) -> tuple[list[pa.Table], list[pa.Table]]:
    """The ``removed`` and ``added`` files' rows without the pairs equal at the same position of
    a removed file and an added file of as many rows that rewrote it.

    An UPDATE without deletion vectors writes each file it touches anew, its rows in their order
    and most of them as they were, so such a pair is mostly the rows kept. A file is paired with
    the removed file of as many rows whose first :data:`_PROBE_ROWS` rows agree most (none where
    none agrees). Values are equal where Arrow has them equal, nulls where both are null (a NaN
    is left)."""
    removed, kept_added = list(removed), []
    for rows in added:
        probe = rows.slice(0, _PROBE_ROWS)
        candidates = [(pc.sum(_equal_rows(probe, other.slice(0, _PROBE_ROWS))).as_py() or 0, i)
                      for i, other in enumerate(removed) if other.num_rows == rows.num_rows]
        agreeing, best = max(candidates, default=(0, None))
        if not agreeing:
            kept_added.append(rows)
            continue
        differing = pc.invert(_equal_rows(rows, removed[best]))
        kept_added.append(rows.filter(differing))
        removed[best] = removed[best].filter(differing)
    return removed, kept_added


def _cancel_by_unique_column(removed: pa.Table, added: pa.Table) -> tuple[pa.Table, pa.Table] | None:
    """``removed`` and ``added`` (both with rows) without the pairs of equal rows found through a column without
    nulls whose values are unique in ``removed`` (the first of :data:`_UNIQUE_TRIES` of exact
    types, a key mostly): each added row is compared with the removed row of its value, and each
    removed row cancels at most one added row. None where no column tried is unique."""
    removed, added = removed.combine_chunks(), added.combine_chunks()  # takes from one chunk are fast
    for name in [f.name for f in removed.schema if _exact(f.type)][:_UNIQUE_TRIES]:
        values = removed.column(name).chunk(0)
        if values.null_count or len(pc.unique(values)) != removed.num_rows:
            continue
        at = pc.index_in(added.column(name), value_set=values)
        added_at = np.flatnonzero(pc.is_valid(at).to_numpy(zero_copy_only=False))
        removed_at = pc.drop_null(at).to_numpy(zero_copy_only=False).astype(np.int64)
        found = added if len(added_at) == added.num_rows else added.take(added_at)  # a DELETE's: every row
        same = _equal_rows(found, removed.take(removed_at)).to_numpy(zero_copy_only=False)
        added_at, removed_at = added_at[same], removed_at[same]
        taken = np.zeros(removed.num_rows, dtype=bool)
        taken[removed_at] = True
        if taken.sum() < len(removed_at):  # an added value twice: each removed row cancels once
            removed_at, first = np.unique(removed_at, return_index=True)
            added_at = added_at[first]
        return _without(removed, removed_at), _without(added, added_at)
    return None


def _exact(data_type: pa.DataType) -> bool:
    """Whether values of ``data_type`` are equal only where they are the same value (no NaN, no -0.0)."""
    return (pa.types.is_integer(data_type) or pa.types.is_string(data_type) or pa.types.is_binary(data_type)
            or pa.types.is_date(data_type) or pa.types.is_decimal(data_type))


def _without(rows: pa.Table, positions: np.ndarray) -> pa.Table:
    keep = np.ones(rows.num_rows, dtype=bool)
    keep[positions] = False
    return rows.filter(pa.array(keep))


def _equal_rows(left: pa.Table, right: pa.Table) -> pa.Array:
    """Where the rows of ``left`` and ``right`` (as many, same columns) are equal, value for value
    (nulls equal to nulls)."""
    return reduce(pc.and_, [pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
                            for a, b in zip(left.columns, right.columns)])


@dataclass(frozen=True)
class ChangeFiles:
    """The files a range of versions' changes are read from (:func:`change_files`)."""

    #: The files' URIs by ``(time, diff, partition values)``: diff None for change data files
    #: (each row's diff by its change type), else +1 (added) or -1 (removed).
    files: dict[tuple[int, int | None, tuple], list[str]]
    #: The partition columns any file has a value of.
    partition_columns: frozenset[str]
    #: Whether a commit in the range sets the table's metadata (with the columns of the one before).
    metadata_changed: bool
    #: The bytes of the added and removed data files (None: an action does not say its size).
    data_bytes: int | None = None


def change_files(path: str, spans: list[tuple[int, int, int]], before: T.StructType) -> ChangeFiles:
    """The files the changes of the Delta table at ``path`` over ``spans`` are read from (see the
    module doc), its schema before the range being ``before``; raises
    :class:`LogChangesUnavailable` where they do not hold the table's rows."""
    first, last = spans[0][1], spans[-1][2]
    files: dict[tuple[int, int | None, tuple], list[str]] = {}
    partition_columns: set[str] = set()
    metadata_changed = False
    data_bytes: int | None = 0
    for time, span_first, span_last in spans:
        for version in range(span_first, span_last + 1):
            actions = _actions(path, version)
            kinds = _CHANGE_DATA if _change_data_holds_the_change(actions) else _DATA
            for action in actions:
                metadata_changed |= _check_metadata(action, before, path, first, last)
                for kind, diff in kinds:
                    change = action.get(kind)
                    if change is None or diff is not None and not change.get("dataChange", True):
                        continue
                    if change.get("deletionVector"):
                        raise LogChangesUnavailable(f"version {version} of {path} has a deletion vector")
                    if "partitionValues" not in change:
                        raise LogChangesUnavailable(f"a {kind} of version {version} of {path} has no partition values")
                    partition_columns.update(change["partitionValues"])
                    values = tuple(sorted(change["partitionValues"].items()))
                    files.setdefault((time, diff, values), []).append(file_uri(path, change["path"]))
                    if diff is not None:
                        data_bytes = None if data_bytes is None or "size" not in change else data_bytes + change["size"]
    return ChangeFiles(files, frozenset(partition_columns), metadata_changed, data_bytes)


def _change_data_holds_the_change(actions: list[dict]) -> bool:
    """Whether a commit's change is read from its change data files: it wrote some, and it is not
    an ``UPDATE`` by delta-rs. delta-rs (1.6.6) leaves out of an update's change data every
    post-image equal to a row the update matched and left as it was: updating ``k`` to 3 where
    ``p = 7`` over ``(3, 7), (4, 7), (6, 7)`` writes the pre-images of ``(4, 7)`` and ``(6, 7)``
    and no post-image. Its added and removed files hold the change exactly."""
    if not any("cdc" in action for action in actions):
        return False
    info = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
    engine = str(info.get("clientVersion") or info.get("engineInfo") or "")
    return not (info.get("operation") == "UPDATE" and engine.startswith("delta-rs"))


@lru_cache(maxsize=1024)
def _actions(path: str, version: int) -> list[dict]:
    """The actions of a commit (a commit file never changes once written)."""
    try:
        return log_actions(path, version)
    except FileNotFoundError:
        raise LogChangesUnavailable(f"the commit file of version {version} of {path} is gone") from None


#: The schemas of tables without column mapping at versions whose changes were read last, by
#: ``(path, version)``: a version's metadata never changes, and a range's changes start where the
#: last range's ended, so the schema before a range is mostly known; the range's own commits say
#: whether it moves (:func:`_check_metadata`).
_schemas_known: dict[tuple[str, int], T.StructType] = {}
_SCHEMAS_KEPT = 1024
#: The rows of the last ranges whose rewrite was consolidated in this process, by ``(path, first,
#: last)`` (see :func:`consolidated_rows`), as many as :data:`_SCHEMAS_KEPT`.
_consolidated_rows: dict[tuple[str, int, int], int] = {}


def _schema_before(spark: SparkSession, path: str, first: int) -> T.StructType:
    """The table's schema at the version before ``first``, where it has no column mapping then;
    else raises :class:`LogChangesUnavailable`. Delta is asked only for a version no range ended
    at."""
    known = _schemas_known.get((path, first - 1))
    if known is not None:
        return known
    if _column_mapping(spark, path, first - 1) not in _NO_COLUMN_MAPPING:
        raise LogChangesUnavailable(f"{path} has column mapping at version {first - 1}")
    return _schema(spark, path, first - 1)


def _remember(path: str, version: int, schema: T.StructType) -> None:
    _schemas_known[path, version] = schema
    while len(_schemas_known) > _SCHEMAS_KEPT:
        del _schemas_known[next(iter(_schemas_known))]


def _column_mapping(spark: SparkSession, path: str, version: int) -> str | None:
    """The table's column mapping mode at ``version`` (it can be removed later, which rewrites
    the files, so the newest version's mode says nothing of an older version's files)."""
    rows = _read_or_unavailable(path, version, lambda: spark.sql(
        f"SHOW TBLPROPERTIES delta.`{spark_uri(path)}@v{version}`").collect())
    return {r.key: r.value for r in rows}.get("delta.columnMapping.mode")


def _schema(spark: SparkSession, path: str, version: int) -> T.StructType:
    """The table's schema at ``version``."""
    return _read_or_unavailable(
        path, version, lambda: spark.read.format("delta").option("versionAsOf", version).load(spark_uri(path)).schema)


def _read_or_unavailable(path: str, version: int, read: Callable[[], _R]) -> _R:
    """``read()``, of the table at ``version``: one that cannot be read (its log cleaned up)
    makes the log changes unavailable."""
    try:
        return read()
    except Exception as exc:
        raise LogChangesUnavailable(f"version {version} of {path} cannot be read: "
                                    f"{str(exc).splitlines()[0][:200]}") from None


def _check_metadata(action: dict, schema: T.StructType, path: str, first: int, last: int) -> bool:
    """Whether ``action`` (of a commit in versions ``first`` to ``last``) sets the table's
    metadata; raises :class:`LogChangesUnavailable` if it sets columns other than ``schema``'s
    (the one before the range) or turns column mapping on."""
    metadata = action.get("metaData")
    if metadata is None:
        return False
    if metadata.get("configuration", {}).get("delta.columnMapping.mode") not in _NO_COLUMN_MAPPING:
        raise LogChangesUnavailable(f"{path} has column mapping in versions {first}..{last}")
    if _columns(T.StructType.fromJson(json.loads(metadata["schemaString"]))) != _columns(schema):
        raise LogChangesUnavailable(f"the schema of {path} changes in versions {first}..{last}")
    return True


def _columns(schema: T.StructType) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def _rows(spark: SparkSession, uris: list[str], data_schema: T.StructType, schema: T.StructType,
          partition: dict[str, str | None], time: int, diff: int | None) -> DataFrame:
    """The rows of the data files ``uris`` (of one partition) with their ``partition`` values (a
    remove leaves out a null one), at ``time`` with ``diff`` (None: change data files, each row's
    diff by its change type)."""
    if diff is None:
        with_type = T.StructType([*data_schema.fields, T.StructField(CHANGE_TYPE, T.StringType())])
        rows = spark.read.schema(with_type).parquet(*uris)
        columns, diff_column = [c for c in rows.columns if c != CHANGE_TYPE], change_diff()
    else:
        rows = spark.read.schema(data_schema).parquet(*uris)
        columns, diff_column = rows.columns, F.lit(diff).cast("long").alias(DIFF)
    types = {f.name: f.dataType for f in schema.fields}
    return rows.select(
        *columns, *[F.lit(value).cast(types[name]).alias(name) for name, value in partition.items()],
        F.lit(time).cast("long").alias(TIME), diff_column)
