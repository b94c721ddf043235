"""A per-group aggregate's input held in this process as an Arrow table, its changed groups recomputed here.

``min``, ``max`` and ``count(DISTINCT x)`` are not moved by sums: a group's row is recomputed from
the group's input rows (:mod:`mvsink.desired.per_group`, which reads them again from the sources
in Spark at every step). Where the aggregate's input is small, it is held here instead, as the
multiset of its rows projected to what the aggregate reads: per distinct row of grouping values
and argument values, its count (:data:`~mvsink.desired.linear_aggregate.ROWS`). A step's change
rows (the join's terms, computed here by :mod:`mvsink.desired.in_process`) move that multiset as
counts add, and each changed group's row is recomputed from its held rows, before and after, with
Arrow's grouped aggregates. No Spark job, and no source read but the change and what it joins.

Taken (:func:`arrow_recompute`) where the query is one ``Aggregate`` (no top) over a row-wise query
of one source or an inner join (:func:`~mvsink.desired.linear_aggregate.recomputed_shape`), every
grouping column an output, grouping by columns of the types Arrow groups as Spark does, its
outputs ``count``, ``sum`` and ``avg`` as :mod:`mvsink.desired.arrow_groups` computes them (over
the rows repeated by their counts), ``min``, ``max`` and one ``count(DISTINCT x)`` of integers,
decimals, strings of the binary collation, dates and booleans (Arrow's order and equality are
Spark's there: strings by their UTF-8 bytes), and its input has at most
:data:`~mvsink.desired.arrow_groups.MOST_GROUPS` distinct rows.

Invariant: the held multiset at a time is the aggregate's input at that time's versions (projected),
every count above 0; a change that would make one negative raises
:class:`~mvsink.desired.arrow_plan.NotEvaluated` (the step goes to Spark, the multiset is held
again from the sources). So each group's row recomputed here is the query's row of that group.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink.desired.arrow_groups import ArrowGroups, Moved, fitted, rows_in_groups, spark_average, wide_type
from mvsink.desired.arrow_plan import NotEvaluated
from mvsink.desired.linear_aggregate import ROWS, LinearAggregate, group_column, value_column
from mvsink.updates import DIFF

#: The outputs whose argument the multiset holds (a grouping column is its group's; ``count(*)`` reads none).
_ARGUMENT_KINDS = ("count", "sum", "avg", "min", "max", "distinct")
#: Spark's types (JSON names; and every decimal) of grouping columns Arrow groups as Spark does.
_GROUP_TYPES = ('"byte"', '"short"', '"integer"', '"long"', '"string"', '"date"', '"boolean"')
_ONLY_VALID = pc.CountOptions(mode="only_valid")
_WIDE_SUM = "_mv_wide"


def arrow_recompute(aggregate: LinearAggregate, schema: T.StructType, input_schema: T.StructType,
                    key: tuple[str, ...]) -> ArrowRecompute | str:
    """The recompute of ``aggregate`` (of :func:`~mvsink.desired.linear_aggregate.recomputed_shape`:
    the query's output ``schema``, its input's ``input_schema``, the view's ``key``) here, or why
    it is not (words for ``explain``)."""
    if not aggregate.rows_are_distinct:
        return "a grouping column is not an output"
    for group in aggregate.groups:
        json = input_schema[group].dataType.json()
        if json not in _GROUP_TYPES and not json.startswith('"decimal('):
            return f"it groups by {group} of type {input_schema[group].dataType.simpleString()}"
    if any(out.kind == "avg" and out.average.how == "unscaled" for out in aggregate.outputs):
        return "an avg of small decimals is Spark's floating point"
    return ArrowRecompute(aggregate, schema, key)


class ArrowRecompute(ArrowGroups):
    """How one view's aggregate input (the multiset: its grouping columns ``_mv_g<i>``, each
    output's argument ``_mv_a<i>``, and each distinct row's count) moves here, and its groups'
    rows are recomputed from it. The steps over times are :class:`ArrowGroups`'."""

    def __init__(self, aggregate: LinearAggregate, schema: T.StructType, key: tuple[str, ...]):
        super().__init__(aggregate, schema, key)
        self.argument_names = [value_column(i) for i, out in enumerate(aggregate.outputs) if out.kind in _ARGUMENT_KINDS]
        self.value_names = [ROWS]
        self._group_outputs = [out.name for out in aggregate.outputs if out.kind == "group"]

    def spark_inputs(self, rows: DataFrame, keep: tuple[str, ...] = (), absent: dict[str, str] | None = None
                     ) -> DataFrame:
        """The multiset of ``rows`` (the aggregate's input, in Spark): a row per distinct
        projected row and its columns ``keep`` (a dimension's keys, :mod:`mvsink.desired.dimension`),
        with its count. A grouping column named in ``absent`` (a dimension's) is null, of the
        SQL type given there."""
        absent = absent or {}
        groups = [(F.lit(None).cast(absent[g]) if g in absent else F.col(g)).alias(name)
                  for g, name in zip(self.aggregate.groups, self.group_names)]
        arguments = [F.col(out.column).alias(value_column(i)) for i, out in enumerate(self.aggregate.outputs)
                     if out.kind in _ARGUMENT_KINDS]
        projected = rows.select(*groups, *arguments, *keep)
        return projected.groupBy(*self.group_names, *self.argument_names, *keep).agg(F.count(F.lit(1)).alias(ROWS))

    def state_rows(self, rows: pa.Table, state_schema: pa.Schema, keep: tuple[str, ...] = ()) -> pa.Table:
        """``rows`` (the aggregate's input rows with their ``DIFF`` of 1 or -1; a grouping column
        they lack is null) as multiset rows of count ``DIFF``, in ``state_schema``'s types, with
        their columns ``keep`` after."""
        diff = rows.column(DIFF)
        if pc.any(pc.invert(pc.is_in(diff, pa.array([1, -1], pa.int64())))).as_py():
            raise NotEvaluated("a change row's diff is not 1 or -1")
        columns = {name: (pc.cast(rows.column(g), state_schema.field(name).type) if g in rows.column_names
                          else pa.nulls(rows.num_rows, state_schema.field(name).type))
                   for g, name in zip(self.aggregate.groups, self.group_names)}
        columns.update({value_column(i): pc.cast(rows.column(out.column), state_schema.field(value_column(i)).type)
                        for i, out in enumerate(self.aggregate.outputs) if out.kind in _ARGUMENT_KINDS})
        columns[ROWS] = diff
        table = pa.table(columns, schema=state_schema)
        for k in keep:
            table = table.append_column(k, rows.column(k))
        return table

    def summed(self, rows: pa.Table, schema: pa.Schema) -> pa.Table:
        """``rows`` (multiset rows, a row's count in ``ROWS``) summed per distinct row, those
        with a count above 0, in ``schema``; :class:`NotEvaluated` where a count is below 0."""
        names = self.group_names + self.argument_names
        summed = rows.group_by(names, use_threads=False).aggregate([(ROWS, "sum")]).rename_columns([*names, ROWS])
        if pc.any(pc.less(summed.column(ROWS), 0)).as_py():
            raise NotEvaluated("a change deletes an input row the held input does not have")
        return summed.filter(pc.greater(summed.column(ROWS), 0)).select(schema.names).cast(schema)

    def moved(self, state: pa.Table, changed: pa.Table) -> Moved:
        """``state`` (the multiset) moved by ``changed`` (of :meth:`state_rows`), and the rows of
        the groups ``changed`` has, recomputed from their held rows before and after."""
        touched = rows_in_groups(state, changed, self.group_names)
        old = state.filter(touched) if touched is not None else state
        new = self.summed(pa.concat_tables([old, changed.cast(state.schema)]), state.schema)
        before, after = self.outputs(old), self.outputs(new)
        retracted, added = _differing(before, after)
        new_state = pa.concat_tables([state.filter(pc.invert(touched)), new]) if touched is not None else new
        if not self._key:
            keys_moved = pa.table({})
        elif self.key_groups is not None:  # a key of grouping columns moves where a group appears or disappears
            gone, came = (rows_in_groups(rows, other, self._group_outputs) for rows, other in ((retracted, after), (added, before)))
            keys_moved = pa.concat_tables([
                (rows.filter(pc.invert(found)) if found is not None else rows).select(self._key)
                for rows, found in ((retracted, gone), (added, came))])
        else:
            keys_moved = pa.concat_tables([retracted.select(self._key), added.select(self._key)])
        return Moved(new_state, retracted, added, keys_moved)

    def most_rows_of_keys(self, state: pa.Table, keys: pa.Table) -> int:
        """As :meth:`ArrowGroups.most_rows_of_keys`, over the multiset's distinct groups."""
        groups = state.select(self.group_names).group_by(self.group_names, use_threads=False).aggregate([])
        return super().most_rows_of_keys(groups, keys)

    def outputs(self, inputs: pa.Table) -> pa.Table:
        """The query's rows (in its types) of the groups of ``inputs`` (multiset rows), each
        computed from its rows repeated by their counts, as Spark computes it over them."""
        if inputs.num_rows == 0:
            return self._schema.empty_table()
        counts = inputs.column(ROWS).to_numpy()
        rows = inputs if (counts == 1).all() else inputs.take(pa.array(np.repeat(np.arange(len(counts)), counts)))
        aggregations = [([], "count_all")]
        for i, out in enumerate(self.aggregate.outputs):
            argument = value_column(i)
            if out.kind in ("sum", "avg"):
                wide = pc.cast(rows.column(argument), wide_type(_summed_type(rows.schema.field(argument).type)))
                rows = rows.append_column(f"{_WIDE_SUM}{i}", wide)
                aggregations += [(f"{_WIDE_SUM}{i}", "sum"), (argument, "count", _ONLY_VALID)]
            elif out.kind == "count":
                aggregations.append((argument, "count", _ONLY_VALID))
            elif out.kind in ("min", "max"):
                aggregations.append((argument, out.kind))
            elif out.kind == "distinct":
                aggregations.append((argument, "count_distinct", _ONLY_VALID))
        grouped = rows.group_by(self.group_names, use_threads=False).aggregate(aggregations)
        columns = []
        for i, (out, field) in enumerate(zip(self.aggregate.outputs, self._schema)):
            argument = value_column(i)
            if out.kind == "group":
                value = grouped.column(group_column(self.aggregate.groups.index(out.column)))
            elif out.kind == "rows":
                value = grouped.column("count_all")
            elif out.kind == "count":
                value = grouped.column(f"{argument}_count")
            elif out.kind in ("min", "max"):
                value = grouped.column(f"{argument}_{out.kind}")
            elif out.kind == "distinct":
                value = grouped.column(f"{argument}_count_distinct")
            else:
                total = grouped.column(f"{_WIDE_SUM}{i}_sum")
                value = (spark_average(out.average, total, grouped.column(f"{argument}_count"))
                         if out.kind == "avg" else total)
            columns.append(fitted(value, field.type))
        return pa.Table.from_arrays(columns, schema=self._schema)


def _summed_type(data_type: pa.DataType) -> pa.DataType:
    """The type a sum of ``data_type`` is added in before it is widened: a decimal's own, an
    integer's ``decimal(38,0)`` (as :class:`~mvsink.desired.linear_aggregate.GroupStates` keeps it)."""
    return data_type if pa.types.is_decimal(data_type) else pa.decimal128(38, 0)


def _differing(before: pa.Table, after: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The rows of ``before`` that ``after`` has not (retracted), and of ``after`` that ``before``
    has not (added); both are distinct rows, null values equal."""
    signed = pa.concat_tables([before.append_column(DIFF, pa.repeat(pa.scalar(-1, pa.int64()), before.num_rows)),
                               after.append_column(DIFF, pa.repeat(pa.scalar(1, pa.int64()), after.num_rows))])
    summed = signed.group_by(before.column_names, use_threads=False).aggregate([(DIFF, "sum")])
    summed = summed.rename_columns([*before.column_names, DIFF])
    diff = summed.column(DIFF)
    return (summed.filter(pc.equal(diff, -1)).select(before.column_names).cast(before.schema),
            summed.filter(pc.equal(diff, 1)).select(after.column_names).cast(after.schema))
