"""A linear aggregate's groups' state held in this process as an Arrow table, and moved here.

Where a step's change rows are computed in this process (:mod:`mvsink.desired.in_process`), the
groups' state they move (:class:`~mvsink.desired.linear_aggregate.GroupStates`: per group its row
count, each aggregate's value and non-nulls) can be held here too, and moved with Arrow compute:
the same state, the same movement and the same output rows as Spark's, with no Spark job. The
updates reach Spark as a local relation.

Taken (:func:`arrow_groups`) where the query is a linear aggregate with no top whose every grouping
column is an output (distinct groups have distinct rows: the updates are consolidated as they
are), its outputs are grouping columns, ``count``, and ``sum`` and ``avg`` of integers or decimals
(an ``avg`` as Spark computes it from the group's sum and count: :func:`spark_average`; not the one of a
decimal of at most 11 digits, which Spark computes in floating point and casts back), and its
state has at most :data:`MOST_GROUPS` groups.

Exactness: values are added as 256-bit decimals (a state's sum has at most 38 digits, so no sum of
a step's rows can overflow them) and fitted to the state's and the output's types with checks; a
value that does not fit raises :class:`~mvsink.desired.arrow_plan.NotEvaluated` and the step goes
to Spark, which decides what it is (an error, or a null). Null grouping values group together, as
in the query.

Key counts: where the view's key columns are grouping columns, a key's row count changes only
where a group appears or disappears, and the state holds every group: the counts of those keys
before and after are read from it (:meth:`ArrowGroups.most_rows_of_keys`). Where none passes 1,
no key violation starts or ends, and no key check runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from mvsink.desired.arrow_plan import NotEvaluated, arrow_schema
from mvsink.desired.linear_aggregate import (ROWS, Average, LinearAggregate, group_column, nonnull_column,
                                             value_column)
from mvsink.updates import DIFF, TIME

#: The most groups whose state is held here (a few tens of MB); a larger state stays in Spark.
MOST_GROUPS = 1_000_000
_TOUCHED, _BEFORE, _ROW = "_mv_touched", "_before", "_mv_row"
#: Where the state has more than this many rows per changed row, only its changed groups are regrouped.
_REGROUPED_SHARE = 4
_WIDE = 76
#: The ``how`` of the averages computed here (:class:`~mvsink.desired.linear_aggregate.Average`).
_AVERAGES = ("double", "decimal")
_EXACT_IN_DOUBLE = 2 ** 53


@dataclass(frozen=True)
class Step:
    """A step's movement of the state over its times: the state after, its updates (the query's
    columns, ``TIME`` and ``DIFF``), and for a keyed view whether a key's row count may pass 1
    or fall from above it (then the key columns of the groups that may have moved one)."""

    state: pa.Table
    updates: pa.Table
    key_counts_change: bool | None
    touched: pa.Table | None


@dataclass(frozen=True)
class Moved:
    """One time's movement of the state: the state after, the groups' output rows it retracts
    and adds (the query's columns), and the key columns of the groups that appeared or
    disappeared (their keys' row counts may change)."""

    state: pa.Table
    retracted: pa.Table
    added: pa.Table
    keys_moved: pa.Table


def arrow_groups(aggregate: LinearAggregate, schema: T.StructType, key: tuple[str, ...]) -> ArrowGroups | str:
    """The state of ``aggregate`` (the query's output ``schema``, the view's ``key``) moved here,
    or why it is not (words for ``explain``)."""
    if aggregate.top:
        return "the query computes over its aggregates"
    if not aggregate.rows_are_distinct:
        return "a grouping column is not an output"
    kinds = {out.kind for out in aggregate.outputs} - {"group", "rows", "count", "sum", "avg"}
    if kinds:
        return f"it has {sorted(kinds)[0]}"
    if any(out.kind == "avg" and out.average.how not in _AVERAGES for out in aggregate.outputs):
        return "an avg of small decimals is Spark's floating point"
    return ArrowGroups(aggregate, schema, key)


class ArrowGroups:
    """How one view's groups' state (columns as :class:`~mvsink.desired.linear_aggregate.GroupStates`
    names them) moves here."""

    def __init__(self, aggregate: LinearAggregate, schema: T.StructType, key: tuple[str, ...]):
        self.aggregate = aggregate
        self._schema = arrow_schema(schema)
        #: The state's columns: its grouping columns, and its values (the row count, each
        #: aggregate's value and non-nulls).
        self.group_names = [group_column(i) for i in range(len(aggregate.groups))]
        self.value_names = [ROWS] + [c for i, out in enumerate(aggregate.outputs)
                                 for c in {"count": [value_column(i)], "sum": [value_column(i), nonnull_column(i)],
                                           "avg": [value_column(i), nonnull_column(i)]}.get(out.kind, [])]
        #: The state's columns of its aggregates' arguments, a state row's own besides its groups
        #: (none here: an aggregate input's multiset has them, :mod:`mvsink.desired.arrow_recompute`).
        self.argument_names: list[str] = []
        #: The state columns of each key column, where the key is grouping columns only (else None:
        #: a key's count can change wherever a row does).
        by_name = {out.name: group_column(aggregate.groups.index(out.column))
                   for out in aggregate.outputs if out.kind == "group"}
        self.key_groups = [by_name[k] for k in key] if key and all(k in by_name for k in key) else None
        self._key = list(key)

    def step(self, state: pa.Table, rows: pa.Table, times: list[int]) -> Step:
        """``state`` moved by ``rows`` (the aggregate's input rows with their ``TIME`` and
        ``DIFF``) at each of ``times`` in turn."""
        at = [(time, rows.filter(pc.equal(rows.column(TIME), time))) for time in times]
        return self.step_by(state, [(time, self.state_rows(part, state.schema)) for time, part in at if part.num_rows])

    def step_by(self, state: pa.Table, changes: list[tuple[int, pa.Table]]) -> Step:
        """``state`` moved by each time's ``changes`` (state rows, as :meth:`state_rows` gives
        them) in turn."""
        parts, touched = [], []
        for time, changed in changes:
            moved = self.moved(state, changed)
            keys = moved.keys_moved
            if keys.num_rows and (self.key_groups is None or max(
                    self.most_rows_of_keys(state, keys), self.most_rows_of_keys(moved.state, keys)) > 1):
                touched.append(keys)
            for rows_, diff in ((moved.retracted, -1), (moved.added, 1)):
                stamps = [pa.repeat(pa.scalar(v, pa.int64()), rows_.num_rows) for v in (time, diff)]
                parts.append(rows_.append_column(TIME, stamps[0]).append_column(DIFF, stamps[1]))
            state = moved.state
        schema = self._schema.append(pa.field(TIME, pa.int64())).append(pa.field(DIFF, pa.int64()))
        updates = pa.concat_tables(parts) if parts else schema.empty_table()
        if not self._key:
            return Step(state, updates, None, None)
        return Step(state, updates, bool(touched), pa.concat_tables(touched) if touched else None)

    def state_rows(self, rows: pa.Table, state_schema: pa.Schema, keep: tuple[str, ...] = ()) -> pa.Table:
        """``rows`` (the aggregate's input rows, each with its ``DIFF`` of 1 or -1; a grouping
        column they lack is null) as state rows of one row each, in ``state_schema``'s grouping
        types and the wide value types, with their columns ``keep`` after."""
        diff = rows.column(DIFF)
        if pc.any(pc.invert(pc.is_in(diff, pa.array([1, -1], pa.int64())))).as_py():
            raise NotEvaluated("a change row's diff is not 1 or -1")
        positive = pc.equal(diff, 1)
        zero = pa.scalar(0, pa.int64())
        columns = {g: (pc.cast(rows.column(name), state_schema.field(g).type) if name in rows.column_names
                       else pa.nulls(rows.num_rows, state_schema.field(g).type))
                   for g, name in zip(self.group_names, self.aggregate.groups)}
        columns[ROWS] = diff
        for i, out in enumerate(self.aggregate.outputs):
            if out.kind not in ("count", "sum", "avg"):
                continue
            present = pc.is_valid(rows.column(out.column))
            counted = pc.if_else(present, diff, zero)
            if out.kind == "count":
                columns[value_column(i)] = counted
            else:
                value = pc.cast(rows.column(out.column), wide_type(state_schema.field(value_column(i)).type))
                columns[value_column(i)] = pc.if_else(positive, value, pc.negate(value))
                columns[nonnull_column(i)] = counted
        return pa.table({**columns, **{k: rows.column(k) for k in keep}})

    def moved(self, state: pa.Table, changed: pa.Table) -> Moved:
        """``state`` (in its own types) moved by ``changed`` (of :meth:`state_rows`): only its
        groups that ``changed`` has are regrouped where they are few (:func:`rows_in_groups`)."""
        state_schema, untouched = state.schema, None
        if self.group_names and state.num_rows > _REGROUPED_SHARE * changed.num_rows:
            touched = rows_in_groups(state, changed, self.group_names)
            if touched is not None:
                state, untouched = state.filter(touched), state.filter(pc.invert(touched))
        wide = pa.table({**{g: state.column(g) for g in self.group_names},
                         **{c: pc.cast(state.column(c), wide_type(state_schema.field(c).type)) for c in self.value_names}})
        tagged = pa.concat_tables([wide.append_column(_TOUCHED, pa.repeat(False, state.num_rows)),
                                   changed.select(wide.column_names).cast(wide.schema).append_column(
                                       _TOUCHED, pa.repeat(True, changed.num_rows))])
        touched = tagged.column(_TOUCHED)
        for c in self.value_names:  # each value summed over all rows, and over the state's alone (before)
            none = pa.nulls(len(tagged), tagged.schema.field(c).type)
            tagged = tagged.append_column(c + _BEFORE, pc.if_else(touched, none, tagged.column(c)))
        summed = tagged.group_by(self.group_names, use_threads=False).aggregate(
            [(c, "sum") for c in self.value_names] + [(c + _BEFORE, "sum") for c in self.value_names] + [(_TOUCHED, "any")])
        summed = summed.rename_columns([n.removesuffix("_sum") for n in summed.column_names])
        moving = summed.filter(summed.column(_TOUCHED + "_any"))
        before, after = self._outputs(moving, _BEFORE), self._outputs(moving, "")
        has = self._has_rows(moving, "")
        had = self._has_rows(moving, _BEFORE)
        same = reduce(pc.and_, [_null_safe_equal(b, a) for b, a in zip(before.columns, after.columns)])
        differs = pc.or_(pc.not_equal(had, has), pc.invert(same))
        retract, add = pc.and_(had, differs), pc.and_(has, differs)
        kept = summed.filter(self._has_rows(summed, "")) if self.group_names else summed
        new_state = pa.Table.from_arrays([fitted(kept.column(c), state_schema.field(c).type) for c in state_schema.names],
                                         schema=state_schema)
        if untouched is not None:
            new_state = pa.concat_tables([untouched, new_state])
        retracted, added = before.filter(retract), after.filter(add)
        if not self._key:
            keys_moved = pa.table({})
        elif self.key_groups is not None:  # grouping columns: only a group appearing or disappearing moves a key
            keys_moved = moving.filter(pc.not_equal(retract, add)).select(self.key_groups).rename_columns(self._key)
        else:
            keys_moved = pa.concat_tables([retracted.select(self._key), added.select(self._key)])
        return Moved(new_state, retracted, added, keys_moved)

    def most_rows_of_keys(self, state: pa.Table, keys: pa.Table) -> int:
        """The most groups of ``state`` that one of ``keys`` (the view's key columns, grouping
        columns: :attr:`key_groups`) has; null keys are not counted (their rows are errors)."""
        wanted = keys.rename_columns(self.key_groups)
        wanted = wanted.filter(reduce(pc.and_, [pc.is_valid(wanted.column(g)) for g in self.key_groups]))
        if wanted.num_rows == 0:
            return 0
        wanted = wanted.group_by(self.key_groups, use_threads=False).aggregate([])
        found = wanted.join(state.select(self.key_groups), keys=self.key_groups, join_type="inner", use_threads=False)
        if found.num_rows == 0:
            return 0
        return pc.max(found.group_by(self.key_groups, use_threads=False).aggregate([([], "count_all")])
                      .column("count_all")).as_py()

    def _has_rows(self, summed: pa.Table, suffix: str) -> pa.ChunkedArray:
        """Whether each group has its output row: it has rows (a query without ``GROUP BY``: always)."""
        if not self.group_names:
            return pa.chunked_array([pa.repeat(True, summed.num_rows)])
        return pc.greater(pc.fill_null(summed.column(ROWS + suffix), 0), 0)

    def _outputs(self, summed: pa.Table, suffix: str) -> pa.Table:
        """The output rows of the groups of ``summed`` from their values ``c + suffix``, fitted
        to the query's types (as ``GroupStates`` computes them in Spark)."""
        columns = []
        for i, (out, field) in enumerate(zip(self.aggregate.outputs, self._schema)):
            if out.kind == "group":
                value = summed.column(group_column(self.aggregate.groups.index(out.column)))
            elif out.kind == "rows":
                value = pc.fill_null(summed.column(ROWS + suffix), 0)
            elif out.kind == "count":
                value = pc.fill_null(summed.column(value_column(i) + suffix), 0)
            else:
                count = pc.fill_null(summed.column(nonnull_column(i) + suffix), 0)
                present = pc.greater(count, 0)
                total = summed.column(value_column(i) + suffix)
                value = pc.if_else(present, total, pa.nulls(summed.num_rows, total.type))
                if out.kind == "avg":
                    value = spark_average(out.average, value, count)
            columns.append(fitted(value, field.type))
        return pa.Table.from_arrays(columns, schema=self._schema)


def spark_average(average: Average, total: pa.ChunkedArray, count: pa.ChunkedArray) -> pa.ChunkedArray:
    """The averages of ``total`` (a group's sum, null where it has no non-null value) over
    ``count``, as Spark computes them (:class:`~mvsink.desired.linear_aggregate.Average`):

    * ``double`` (of integers): the sum and the count as doubles, divided. Both are exact where
      the sum is within 2**53 (a larger one raises :class:`NotEvaluated`), and a division of
      doubles is IEEE's in both.
    * ``decimal``: the sum, which must fit Spark's sum type, divided by the count rounded half up
      to 38 places (Spark's ``Decimal./``), then half up to the output's scale; a result that does
      not fit the output raises :class:`NotEvaluated`. In integers, exactly."""
    if average.how == "double":
        if (pc.max(pc.abs(total)).as_py() or 0) > _EXACT_IN_DOUBLE:
            raise NotEvaluated("an average's sum is past 2**53")
        return pc.divide(pc.cast(total, pa.float64()), pc.cast(count, pa.float64()))
    sum_precision = int(average.sum_type.removeprefix("decimal(").split(",")[0])
    precision, scale = average.result
    averages = []
    for value, rows in zip(total.to_pylist(), count.to_pylist()):
        if value is None:
            averages.append(None)
            continue
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits))) * 10 ** (exponent + total.type.scale)
        if unscaled >= 10 ** sum_precision:
            raise NotEvaluated(f"an average's sum does not fit {average.sum_type}")
        places_38 = _half_up(unscaled * 10 ** (38 - total.type.scale), rows)
        result = _half_up(places_38, 10 ** (38 - scale))
        if result >= 10 ** precision:
            raise NotEvaluated(f"an average does not fit decimal({precision},{scale})")
        averages.append(Decimal((sign, tuple(map(int, str(result))), -scale)))
    return pa.chunked_array([pa.array(averages, pa.decimal128(precision, scale))])


def _half_up(dividend: int, divisor: int) -> int:
    """``dividend / divisor`` (both at least 0, ``divisor`` above 0) rounded half up."""
    quotient, remainder = divmod(dividend, divisor)
    return quotient + (2 * remainder >= divisor)


def wide_type(data_type: pa.DataType) -> pa.DataType:
    """The type a state value is added in: a decimal's 256-bit one at its scale; counts as they are."""
    return pa.decimal256(_WIDE, data_type.scale) if pa.types.is_decimal(data_type) else data_type


def fitted(values: pa.ChunkedArray, data_type: pa.DataType) -> pa.ChunkedArray:
    """``values`` cast to ``data_type``; a value that does not fit raises :class:`NotEvaluated`."""
    try:
        return pc.cast(values, data_type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise NotEvaluated(f"a value does not fit {data_type}: {exc}") from None


def rows_in_groups(state: pa.Table, changed: pa.Table, groups: list[str]) -> pa.ChunkedArray | None:
    """Whether each row of ``state`` has a group (its ``groups`` columns) that a row of ``changed``
    has, null values equal; None where Arrow's joins do not take a column's type, or a column is
    all null."""
    right = changed.select(groups).cast(state.select(groups).schema)
    fillers = {g: _first_value(state.column(g), right.column(g)) for g in groups}
    if None in fillers.values():
        return None
    row_ids = pa.array(range(state.num_rows), pa.int64())
    try:
        left = _null_flagged(state.select(groups), fillers).append_column(_ROW, row_ids)
        right = _null_flagged(right, fillers)
        keys = right.column_names
        found = left.join(right.group_by(keys, use_threads=False).aggregate([]), keys=keys, join_type="left semi",
                          use_threads=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return pc.is_in(row_ids, value_set=found.column(_ROW).combine_chunks())


def _null_flagged(table: pa.Table, fillers: dict[str, pa.Scalar]) -> pa.Table:
    """``table``'s columns with their nulls replaced by the column's filler, each beside whether
    it was null: equal rows are equal here, null values included (a join matches no null)."""
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        columns[name] = pc.fill_null(column, fillers[name])
        columns[name + "_null"] = pc.is_null(column)
    return pa.table(columns)


def _first_value(*columns: pa.ChunkedArray) -> pa.Scalar | None:
    """The first non-null value of ``columns`` (None: they are all null)."""
    for column in columns:
        values = column.drop_null()
        if len(values):
            return values[0]
    return None


def _null_safe_equal(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """``a <=> b``: both null, or both set and equal."""
    return pc.or_(pc.and_(pc.is_null(a), pc.is_null(b)), pc.fill_null(pc.equal(a, b), False))
