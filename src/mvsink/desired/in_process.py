"""A small step's change terms of an inner join (or of a linear aggregate over one), computed in this process.

An inner join's change is its terms (:mod:`mvsink.desired.join`): each source's change joined
with the other sides, read only where the change's keys lie; a linear aggregate over one (TPC-H
Q3), or over one source (Q1: its one term is the change), moves its groups by them. For a change
of a few thousand rows those are a few files: Spark's jobs to hold the changes and to plan and run
each term cost most of a step, the rows almost nothing. So where the step's changes are small,
the terms are computed here, in the driver, with Arrow, and only the rows they yield (the join's,
or the aggregate's input) go to Spark (a local relation), where the updates are consolidated, or
the groups' state moves, as before:

* each moving source's change is read from the files its commits name (the ones
  :mod:`mvsink.desired.log_changes` lists: change data files, else added and removed files),
  with PyArrow;
* the other sides are read from their files that can hold the change's keys (listed by delta-rs
  from the log with their statistics, :mod:`mvsink.desired.listed_files`), with PyArrow; a file's
  rows are kept between steps (a data file never changes), up to :data:`CACHED_ROWS` rows;
* each term is the plan Spark optimized for the query (a linear aggregate's input) over held rows,
  evaluated over those tables (:mod:`mvsink.desired.arrow_plan`), with the terms' versions and
  signs exactly as Spark's path has them (:meth:`mvsink.desired.snapshot.SnapshotDesired._change_terms`).

A step is computed here only where all of that holds; otherwise :meth:`InProcessTerms.terms`
raises :class:`Declined` with the reason before anything is used, and Spark computes the step.
It declines where a change's files pass :data:`~mvsink.desired.changes.ONE_TASK_BYTES` (a large
change is Spark's work), where a source's files at a version read are not plain Parquet (deletion
vectors, column mapping, partitions), where a source's columns at a version read are not the ones
the plan was made for, where a commit in the step changes a source's metadata, and where a value
does not fit its type (:class:`~mvsink.desired.arrow_plan.NotEvaluated`).

Invariant: the terms here are, as multisets, the terms Spark's path computes for the same step.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from mvsink import storage
from mvsink.desired.arrow_plan import ArrowPlan, NotEvaluated, arrow_schema
from mvsink.desired.changes import SourceRead, feed_is_small
from mvsink.desired.join import ranges_of_column
from mvsink.desired.listed_files import files_in_ranges, is_plain
from mvsink.desired.log_changes import CHANGE_TYPE, LogChangesUnavailable, change_files
from mvsink.table import file_uri, spark_uri
from mvsink.updates import DIFF, TIME

#: The most rows of the sources' files kept between steps.
CACHED_ROWS = 4_000_000
#: The most rows a step reads of the other sides (by the files' statistics): more is Spark's work.
MOST_ROWS_READ = 2_000_000
#: The change types of rows inserted (+1) and deleted (-1) by a change data file.
_INSERTED, _DELETED = pa.array(["insert", "update_postimage"]), pa.array(["delete", "update_preimage"])


class Declined(Exception):
    """The step's terms are not computed here (the message says why): Spark computes them."""


@dataclass(frozen=True)
class _Version:
    """A source at a version as delta-rs lists it: its add actions (None: not plain Parquet) and
    whether its columns are the plan's."""

    actions: pa.Table | None
    columns_match: bool


class InProcessTerms:
    """The change terms of ``plan`` (the query, or a linear aggregate's input, over held rows, translated) over the
    sources ``paths`` (by name) it reads in the view's order ``read``, joined by ``join_keys``
    (per source, per other source, the pairs ``(its column, the other's)``), whose columns are
    ``schemas`` (each source's, as the plan was made for)."""

    def __init__(self, plan: ArrowPlan, paths: dict[str, str], read: tuple[str, ...],
                 join_keys: dict[str, dict[str, list[tuple[str, str]]]], schemas: dict[str, T.StructType]):
        self._plan, self._paths, self._read, self._join_keys = plan, paths, read, join_keys
        self._schemas = {name: T.StructType([schemas[name][c] for c in plan.columns[name]]) for name in read}
        self._arrow = {name: arrow_schema(schema) for name, schema in self._schemas.items()}
        self._full_schemas = {name: schemas[name] for name in read}
        self._columns = {name: [(f.name, f.dataType.simpleString()) for f in schemas[name].fields] for name in read}
        self._versions: dict[tuple[str, int], _Version] = {}
        self._files: OrderedDict[tuple[str, tuple[str, ...], bool], pa.Table] = OrderedDict()
        self._cached_rows = 0
        self._rows_read = 0

    @property
    def schema(self) -> T.StructType:
        """The Spark schema of :meth:`terms`' rows: the plan's, ``TIME`` and ``DIFF``."""
        return T.StructType([*self._plan.schema.fields, T.StructField(TIME, T.LongType()),
                             T.StructField(DIFF, T.LongType())])

    def terms(self, times: list[int], versions: Callable[[int], dict[str, int]]) -> tuple[pa.Table, list[SourceRead]]:
        """The plan's rows of every term at ``times`` (``versions(t)``: the sources'
        versions at time ``t``), with each row's ``TIME`` and ``DIFF``, and the other sides' reads;
        :class:`Declined` where the step is Spark's."""
        self._rows_read = 0
        try:
            changes = {name: self._changes(name, times, versions) for name in self._read
                       if any(versions(t - 1)[name] != versions(t)[name] for t in times)}
            ranges = {(name, column): ranges_of_column(rows.column(column)) for name, rows in changes.items()
                      for column in sorted({c for pairs in self._join_keys.get(name, {}).values() for c, _ in pairs})}
            reads: dict[tuple, pa.Table] = {}
            listed: list[SourceRead] = []
            parts = []
            for time in times:
                before, after = versions(time - 1), versions(time)
                for i, name in enumerate(self._read):
                    if name not in changes or before[name] == after[name] or any(
                            not ranges[name, column] for pairs in self._join_keys.get(name, {}).values()
                            for column, _ in pairs):
                        continue
                    rows = changes[name].filter(pc.equal(changes[name].column(TIME), time))
                    if rows.num_rows == 0:
                        continue
                    others = {}
                    for j, other in enumerate(self._read):
                        if j != i:
                            cuts = [(other_column, ranges[name, column])
                                    for column, other_column in self._join_keys.get(name, {}).get(other, [])]
                            version = (after if j < i else before)[other]
                            others[other] = self._other_side(other, version, cuts, reads, listed)
                    for diff in (1, -1):
                        signed = rows.filter(pc.equal(rows.column(DIFF), diff))
                        if signed.num_rows:
                            term = self._plan.evaluate({**others, name: signed})
                            if term.num_rows:
                                stamp = [pa.repeat(pa.scalar(value, pa.int64()), term.num_rows) for value in (time, diff)]
                                parts.append(term.append_column(TIME, stamp[0]).append_column(DIFF, stamp[1]))
        except NotEvaluated as exc:
            raise Declined(f"a value Spark decides: {exc}") from None
        except LogChangesUnavailable as exc:
            raise Declined(str(exc)) from None
        if not parts:
            schema = self._plan.arrow_schema.append(pa.field(TIME, pa.int64())).append(pa.field(DIFF, pa.int64()))
            return schema.empty_table(), listed
        return pa.concat_tables(parts), listed

    def rows_of(self, name: str, version: int, cuts: list[tuple[str, list[tuple]]]) -> tuple[pa.Table, list[SourceRead]]:
        """The plan's rows over source ``name`` alone (a plan of one source) at ``version``, its
        rows in the files that can hold a value of each ``(column, ranges)`` of ``cuts``, and the
        read; :class:`Declined` as :meth:`terms`."""
        self._rows_read, listed = 0, []
        try:
            return self._plan.evaluate({name: self._other_side(name, version, cuts, {}, listed)}), listed
        except NotEvaluated as exc:
            raise Declined(f"a value Spark decides: {exc}") from None

    def _changes(self, name: str, times: list[int], versions: Callable[[int], dict[str, int]]) -> pa.Table:
        """Source ``name``'s changed rows at ``times`` (the plan's columns of it), with ``TIME``
        and ``DIFF``, read from the files its commits name."""
        path = self._paths[name]
        spans = [(t, versions(t - 1)[name] + 1, versions(t)[name]) for t in times]
        spans = [span for span in spans if span[1] <= span[2]]
        first, last = spans[0][1], spans[-1][2]
        if not feed_is_small(path, first, last):
            raise Declined(f"the change of source {name} at versions {first}..{last} is not small")
        if not self._version(name, first - 1).columns_match:
            raise Declined(f"the columns of source {name} at version {first - 1} are not the plan's")
        listed = change_files(path, spans, self._full_schemas[name])
        if listed.partition_columns or listed.metadata_changed:
            raise Declined(f"source {name} has partitions or a metadata change in versions {first}..{last}")
        parts = []
        for (time, diff, _), uris in listed.files.items():
            for uri in uris:
                rows = self._read_file(name, uri, with_change_type=diff is None)
                if diff is None:
                    types = rows.column(CHANGE_TYPE)
                    diffs = pc.if_else(pc.is_in(types, value_set=_INSERTED), 1,
                                       pc.if_else(pc.is_in(types, value_set=_DELETED), -1, pa.scalar(None, pa.int64())))
                    rows = rows.drop_columns([CHANGE_TYPE])
                else:
                    diffs = pa.repeat(pa.scalar(diff, pa.int64()), rows.num_rows)
                parts.append(rows.append_column(TIME, pa.repeat(pa.scalar(time, pa.int64()), rows.num_rows))
                             .append_column(DIFF, diffs))
        if not parts:
            return self._arrow[name].append(pa.field(TIME, pa.int64())).append(pa.field(DIFF, pa.int64())).empty_table()
        return pa.concat_tables(parts)

    def _other_side(self, name: str, version: int, cuts: list[tuple[str, list[tuple]]], reads: dict[tuple, pa.Table],
                    listed: list[SourceRead]) -> pa.Table:
        """Source ``name`` at ``version``, its rows in the files that can hold a value of each
        ``(column, ranges)`` of ``cuts`` (every file where there is none), once per step."""
        key = (name, version, tuple((column, tuple(ranges)) for column, ranges in cuts))
        if key not in reads:
            state = self._version(name, version)
            if state.actions is None:
                raise Declined(f"the files of source {name} at version {version} are not plain Parquet")
            if not state.columns_match:
                raise Declined(f"the columns of source {name} at version {version} are not the plan's")
            uris = files_in_ranges(self._paths[name], state.actions, self._schemas[name],
                                   [(column, ranges, False) for column, ranges in cuts])
            self._rows_read += _records(state.actions, set(uris), self._paths[name])
            if self._rows_read > MOST_ROWS_READ:
                raise Declined(f"its terms read more than {MOST_ROWS_READ:,} rows of the other sides")
            tables = [self._read_file(name, uri) for uri in uris]
            reads[key] = pa.concat_tables(tables) if tables else self._arrow[name].empty_table()
            listed.append(SourceRead(spark_uri(self._paths[name]), version, len(uris), state.actions.num_rows))
        return reads[key]

    def _version(self, name: str, version: int) -> _Version:
        """Source ``name`` at ``version`` as delta-rs lists it, once per version."""
        if (name, version) not in self._versions:
            path = self._paths[name]
            try:
                table = DeltaTable(storage.delta_uri(path), version=version, storage_options=storage.storage_options(path))
                schema = T.StructType.fromJson(json.loads(table.schema().to_json()))
                columns = [(f.name, f.dataType.simpleString()) for f in schema.fields]
                actions = pa.table(table.get_add_actions(flatten=True)) if is_plain(table) else None
            except Exception as exc:  # Spark reads it through Delta: slower, never wrong
                raise Declined(f"source {name} at version {version} is not listed by delta-rs: "
                               f"{str(exc).splitlines()[0][:200]}") from None
            self._versions = {k: v for k, v in self._versions.items() if k[0] != name or k[1] >= version - 1}
            self._versions[name, version] = _Version(actions, columns == self._columns[name])
        return self._versions[name, version]

    def _read_file(self, name: str, uri: str, with_change_type: bool = False) -> pa.Table:
        """The plan's columns of source ``name`` in the Parquet file ``uri`` (a column the file
        lacks: nulls), in their Arrow types; with ``with_change_type``, its change type too."""
        # By the columns read: two reads of one source (nation, nation__2) share a file where they read the same.
        key = (uri, tuple(self._arrow[name].names), with_change_type)
        if key in self._files:
            self._files.move_to_end(key)
            return self._files[key]
        fs, path = storage.filesystem(uri)
        with fs.open_input_file(path) as f:
            parquet = pq.ParquetFile(f)
            present = set(parquet.schema_arrow.names)
            wanted = [c for c in self._arrow[name].names if c in present] + ([CHANGE_TYPE] if with_change_type else [])
            rows = parquet.read(columns=wanted)
        columns = [pc.cast(rows.column(field.name), field.type, safe=True) if field.name in present
                   else pa.nulls(rows.num_rows, field.type) for field in self._arrow[name]]
        table = pa.Table.from_arrays(columns, schema=self._arrow[name])
        if with_change_type:
            table = table.append_column(CHANGE_TYPE, rows.column(CHANGE_TYPE))
        self._files[key] = table
        self._cached_rows += table.num_rows
        while self._cached_rows > CACHED_ROWS and len(self._files) > 1:
            _, dropped = self._files.popitem(last=False)
            self._cached_rows -= dropped.num_rows
        return table


def _records(actions: pa.Table, uris: set[str], path: str) -> int:
    """The rows of the files ``uris`` among ``actions`` (of the table at ``path``) by their
    statistics (a file without them counts as :data:`MOST_ROWS_READ`)."""
    paths = actions.column("path").to_pylist()
    counts = (actions.column("num_records").to_pylist() if "num_records" in actions.column_names
              else [None] * len(paths))
    return sum(MOST_ROWS_READ if count is None else count
               for p, count in zip(paths, counts) if file_uri(path, p) in uris)


def local_relation(spark: SparkSession, rows: pa.Table, schema: T.StructType) -> DataFrame:
    """``rows`` (of ``schema``) as a Spark DataFrame over a local relation, from one record batch:
    PySpark 4.0's ``createDataFrame`` of a table whose record batches include empty ones loses
    rows (batches of 0, 0 and 2 rows give none)."""
    return spark.createDataFrame(rows.combine_chunks(), schema=schema)
