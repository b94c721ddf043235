"""Whether a snapshot view's query is a *linear aggregate*, and its changes from its source's changes.

A query is a linear aggregate when its optimized logical plan is one ``Aggregate`` that groups by
columns (or none) and computes only ``count(*)``, ``count(column)``, and ``sum`` and ``avg`` of
an integral or decimal column or expression of its input, over one of:

* a row-wise query (:mod:`mvsink.desired.row_wise`: projections and filters of one scan);
* an inner join (or union all) of several sources (:mod:`mvsink.desired.join`);
* an outer join among inner joins whose padded side only the aggregates read, each null where it
  is padded (:mod:`mvsink.desired.outer_join`: :func:`aggregate_over_outer_join`), as the inner
  join plus the kept side's rows padded;
* a per-group query (:mod:`mvsink.desired.per_group`: an aggregate of an aggregate, an aggregate
  over an outer join: :func:`aggregate_of_groups`);
* another linear aggregate whose output columns it aggregates as they are (a rollup:
  :func:`aggregate_of_aggregate`; the one below maybe over an outer join, as above).

``SELECT DISTINCT`` and ``UNION`` are such aggregates with no aggregate column: a row is there
while its count is not 0. Each output column is a grouping column or one such aggregate.

Such aggregates add up: over a multiset of rows each with a diff, a group's count is the sum of
the diffs and its sum the sum of value times diff. So the view keeps a *state*, per group: its row
count ``n``, and per output column its count or its sum with the count of its non-null values
(a sum of none is null; an average is that sum divided by that count as Spark divides them:
:class:`Average`). The state at a time plus the aggregates of its input's changes is the state at
the next time, computed in one grouping of both. Those changes are, by what is below: the row-wise
part applied to inserted rows at +1 and deleted rows at -1; a join's terms of the delta rule (an
outer join's: the inner join's, and the kept side's changed rows padded); a per-group query's rows
of the changed groups recomputed after at +1 and before at -1 (they differ from its change only by
rows that cancel); the rows a rollup's state below retracts and adds as its
own input's changes move it. The group's output row before and after is its change (-1, +1; a
group whose count falls to 0 is gone). The work follows the change and the groups, not the source.
A query without ``GROUP BY`` (TPC-H Q6's one sum) is one group whose row is there even over no
rows (counts 0, sums and averages null), as Spark's global aggregate has it. Sums and averages of
floating point (order-dependent), min/max and distinct aggregates are not linear aggregates: they
are recomputed. Expressions of the aggregates
and ``HAVING`` are a row-wise *top* over one (:mod:`mvsink.desired.aggregate_top`): the state is the
aggregate's (its *core*'s), and the top maps the rows it retracts and adds to the query's.

Invariant: the output rows of the state at a time are exactly the query's result at that time's
versions (each column cast to the query's type). For an average of integers Spark sums doubles:
the two agree wherever the sums stay within 2**53, the range in which Spark's own result does not
depend on the order of the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import reduce

from pyspark import SparkContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.classic.column import Column as ClassicColumn

from mvsink.desired.aggregate_top import aggregate_core
from mvsink.desired.changes import touched_values
from mvsink.desired.join import plan_is_inner_join
from mvsink.desired.outer_join import padded_leaves
from mvsink.desired.per_group import PerGroup, per_group
from mvsink.desired.row_wise import plan_is_row_wise, plan_reads_subqueries, under_row_wise
from mvsink.updates import DIFF

#: State columns: each group column, the group's row count, each aggregate's value and non-nulls.
ROWS, _TOUCHED = "_mv_n", "_mv_touched"
#: Columns of :meth:`GroupStates.next_state`: whether a group's row before is retracted, after
#: added, and whether that may change a key's row count.
_RETRACT, _ADD, _KEY_MOVES = "_mv_retract", "_mv_add", "_mv_key_moves"
_EXACT_SUM_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType)
#: The types (Spark's JSON names; and every decimal) whose ``min``, ``max`` and distinct values
#: Arrow computes as Spark does: integers, strings of the default (binary) collation, dates, booleans.
RECOMPUTED_TYPES = ('"byte"', '"short"', '"integer"', '"long"', '"string"', '"date"', '"boolean"')


@dataclass(frozen=True)
class Output:
    """One output column: ``kind`` is ``group`` (``column`` is the grouping column), ``rows``
    (``count(*)``), ``count``, ``sum`` or ``avg`` (of ``column``, a column of the aggregate's
    input; for an expression, the column :meth:`LinearAggregate.aggregate_input` adds, and
    ``expression`` its SQL). A sum of integers is kept as ``decimal(38,0)``: negating a deleted
    row's value, or a sum on the way, cannot overflow where the query's own sum would not.
    ``average`` says how an ``avg`` is computed from its sum and count (:class:`Average`)."""

    name: str
    kind: str
    column: str | None
    kept_as: str | None = None
    expression: str | None = None
    average: Average | None = None


@dataclass(frozen=True)
class Average:
    """How Spark computes an ``avg`` from its sum and count of non-null values (Spark 4.0's
    ``Average.evaluateExpression``, and the optimizer's ``DecimalAggregates``):

    * ``double``: of integers, ``CAST(sum AS DOUBLE) / CAST(count AS DOUBLE)``;
    * ``decimal``: of ``decimal(p, s)``, ``DecimalDivideWithOverflowCheck(CAST(sum AS
      decimal(p+10, s)), CAST(count AS decimal(20, 0)), decimal(p+4, s+4))`` (bounded to 38;
      ``null_on_overflow`` unless ANSI);
    * ``unscaled``: of ``decimal(p, s)`` with ``p + 4 <= 15``, which the optimizer rewrites to
      the ``double`` average of the unscaled values divided by ``divisor`` (``10**s``), cast to
      the output's ``decimal(p+4, s+4)``.

    Each is null where the count is 0."""

    how: str
    sum_type: str | None = None
    result: tuple[int, int] | None = None
    null_on_overflow: bool = True
    divisor: float | None = None


@dataclass(frozen=True)
class LinearAggregate:
    """The shape of a linear aggregate query: its grouping columns and output columns; with
    ``top``, those of its :func:`~mvsink.desired.aggregate_top.aggregate_core`, the query being a
    row-wise top over that (:class:`~mvsink.desired.aggregate_top.RowWiseTop`)."""

    groups: tuple[str, ...]
    outputs: tuple[Output, ...]
    top: bool = False

    def aggregate_input(self, result: DataFrame) -> DataFrame:
        """The rows the ``Aggregate`` of ``result`` (this query over some rows) groups: its
        row-wise input, as a DataFrame, with a column per aggregated expression (its value in
        that row, as the query computes it).

        Where the aggregate reads columns only, taken from the analyzed plan if its top is that
        ``Aggregate`` and its input has each column the aggregate reads under its name, once:
        then the input is optimized once, with whatever it becomes part of (a step's terms are
        one plan; optimizing a term alone costs its scans' data skipping again). Otherwise from
        the optimized plan, whose ``Aggregate`` this shape was read from (and whose expressions
        the added columns are); under a top, its core's."""
        execution = self.core(result)._jdf.queryExecution()
        plan = execution.analyzed()
        if (plan.nodeName() != "Aggregate" or any(out.expression is not None for out in self.outputs)
                or not self._reads_by_name(plan.child())):
            plan = execution.optimizedPlan()
        spark = result.sparkSession
        jvm = spark.sparkContext._jvm
        rows = DataFrame(jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, plan.child()), spark)
        computed = [ClassicColumn(jvm.org.apache.spark.sql.classic.ExpressionUtils.column(argument)).alias(out.column)
                    for out, argument in zip(self.outputs, _arguments(plan)) if out.expression is not None]
        return rows.select("*", *computed) if computed else rows

    def core(self, result: DataFrame) -> DataFrame:
        """``result`` (this query over some rows) without its top, if it has one."""
        return aggregate_core(result) if self.top else result

    def _reads_by_name(self, plan) -> bool:
        """Whether ``plan``'s output has each grouping and aggregated column once (by Spark's
        case-insensitive resolution)."""
        names = [name.lower() for name in _attribute_names(plan)]
        read = {*self.groups, *(o.column for o in self.outputs if o.kind != "group" and o.column)}
        return all(names.count(name.lower()) == 1 for name in read)

    @property
    def rows_are_distinct(self) -> bool:
        """Whether distinct groups have distinct output rows: every grouping column is an output.
        Then the updates of :meth:`GroupStates.updates` are consolidated as they are: per time,
        each group has at most one row retracted and one, different, added."""
        return all(any(o.kind == "group" and o.column == g for o in self.outputs) for g in self.groups)

    def is_group_output(self, name: str) -> bool:
        """Whether output column ``name`` is a grouping column."""
        return any(o.kind == "group" and o.name == name for o in self.outputs)

    def groups_are_keyed(self, key: tuple[str, ...]) -> bool:
        """Whether ``key`` holds every grouping column (as an output named in it): then the query
        has at most one row per key value at any versions, so no key violation can ever start."""
        return all(any(o.kind == "group" and o.column == g and o.name in key for o in self.outputs)
                   for g in self.groups)


class GroupStates:
    """A linear aggregate's state per group, and how the change feed moves it, for one view (the
    query's output ``schema``, the view's ``key``).

    Its Spark expressions are built once, here: a step only composes DataFrames of them (each
    expression built is a round trip to the JVM; a step's few hundred cost a tenth of a second)."""

    def __init__(self, aggregate: LinearAggregate, schema: T.StructType, key: tuple[str, ...]):
        self.aggregate = aggregate
        self._groups = [F.col(group_column(i)) for i in range(len(aggregate.groups))]
        state = [ROWS] + [c for i, out in enumerate(aggregate.outputs)
                        for c in {"count": [value_column(i)], "sum": [value_column(i), nonnull_column(i)],
                                 "avg": [value_column(i), nonnull_column(i)]}.get(out.kind, [])]
        self._state_columns = [*self._groups, *[F.col(c) for c in state]]
        self._as_state = {diff: self._state_row(diff) for diff in (1, -1)}
        self._grouped = [F.sum(c).alias(c) for c in state]
        self._value_names = tuple(state)
        touched = F.col(_TOUCHED)
        self._sums = ([F.sum(F.when(~touched, F.col(c))).alias(_before(c)) for c in state] + self._grouped
                      + [F.max(touched).alias(_TOUCHED)])
        before, after = self._output_values(schema, _before), self._output_values(schema, lambda c: c)
        # a grouped query has a group's row while the group has rows; one without GROUP BY has its
        # one row always (its counts 0 and sums null over no rows)
        has_rows = F.col(ROWS) > 0 if aggregate.groups else F.lit(True)
        had, has = (F.coalesce(F.col(_before(ROWS)), F.lit(0)) > 0 if aggregate.groups else F.lit(True)), has_rows
        # a group's row appears or disappears even where its values would be the same (grouping
        # columns only, as of SELECT DISTINCT; a sum of only nulls)
        differs = (had != has) | ~reduce(Column.__and__, [b.eqNullSafe(a) for b, a in zip(before, after)])
        retract = touched & differs & had
        add = touched & differs & has
        # A key holding every grouping column has one row at most: no count matters. A key of
        # grouping columns only has the same value before and after: its count changes only where
        # a group's row appears or disappears. Otherwise any row moved may move a key.
        groups_only = all(aggregate.is_group_output(k) for k in key)
        if aggregate.groups_are_keyed(key):
            key_moves = F.lit(False)
        else:
            key_moves = (retract != add) if groups_only else (retract | add)
        self._moves = [F.col("*"), retract.alias(_RETRACT), add.alias(_ADD), key_moves.alias(_KEY_MOVES)]
        #: Aggregates over :meth:`next_state`'s rows, by whether they are few (see
        #: :meth:`movement`).
        movement = [
            F.coalesce(F.sum(F.col(_RETRACT).cast("long") + F.col(_ADD).cast("long")), F.lit(0)).alias("size"),
            F.coalesce(F.max(_KEY_MOVES), F.lit(False)).alias("key_moves"),
            F.coalesce(F.sum((F.col(ROWS) > 0).cast("long")), F.lit(0)).alias("groups")]
        if key:  # the first key column of the rows that may move a key's count: retracted, added
            first = schema.names.index(key[0])
            touches = [(F.col(_KEY_MOVES) & F.col(_RETRACT), before[first]),
                       (F.col(_KEY_MOVES) & F.col(_ADD), after[first])]
            self._movement = {small: movement + touched_values(touches, small) for small in (True, False)}
        else:
            self._movement = {small: movement for small in (True, False)}
        self._has_rows, self._moved = has_rows, F.col(_RETRACT) | F.col(_ADD)

        def row(values: list[Column], diff: int, when: str) -> Column:
            fields = [v.alias(f.name) for v, f in zip(values, schema.fields)] + [F.lit(diff).cast("long").alias(DIFF)]
            return F.when(F.col(when), F.struct(*fields))
        rows = F.array(row(before, -1, _RETRACT), row(after, 1, _ADD))
        self._updates = F.inline(F.filter(rows, lambda r: r.isNotNull()))
        self._output = [v.alias(f.name) for v, f in zip(after, schema.fields)]

    def movement(self, small: bool) -> list[Column]:
        """Aggregates over :meth:`next_state`'s rows: how many updates :meth:`updates` makes of
        them, whether a key's row count may change (False where none may), how many groups
        remain; for a keyed view, the values of the first key column of :meth:`key_moving_updates`
        and whether one is null (:func:`~mvsink.desired.changes.touched_values`: distinct where the
        rows are ``small``, else their least and greatest)."""
        return self._movement[small]

    def rows_as_state(self, rows: DataFrame, diff: int, keep: tuple[str, ...] = ()) -> DataFrame:
        """``rows`` (the aggregate's input rows), each at ``diff``, as a state of one row each
        (not grouped: :meth:`state` and :meth:`next_state` sum them per group), with their
        columns ``keep`` after."""
        return rows.select(*self._as_state[diff], *keep)

    def state(self, *rows: DataFrame) -> DataFrame:
        """The state of ``rows`` (the aggregate's input rows, in one or more parts): one row per group."""
        return self.summed(reduce(DataFrame.unionByName, [self.rows_as_state(part, 1) for part in rows]))

    def summed(self, states: DataFrame, *more: str) -> DataFrame:
        """``states`` (rows of :meth:`rows_as_state`) summed per group, and per value of their
        columns ``more``."""
        return states.groupBy(*self._groups, *more).agg(*self._grouped)

    @property
    def group_names(self) -> list[str]:
        """The state's grouping columns, in the order of the aggregate's groups."""
        return [group_column(i) for i in range(len(self.aggregate.groups))]

    @property
    def value_names(self) -> list[str]:
        """The state's other columns: the row count, each aggregate's value and non-nulls."""
        return list(self._value_names)

    def next_state(self, state: DataFrame, changed_rows: DataFrame, one_task: bool = False) -> DataFrame:
        """Per group of ``state`` or ``changed_rows`` (from :meth:`rows_as_state`): its state before
        and after them, whether its output row before is retracted and after added (touched, and
        the row differs), and whether that may change the row count of a key of the view. Null
        group values group together, as in the query. One grouping of both: one shuffle, or
        with ``one_task`` (both are small) one task and none."""
        tagged = state.withColumn(_TOUCHED, F.lit(False)).unionByName(changed_rows.withColumn(_TOUCHED, F.lit(True)))
        if one_task:
            tagged = tagged.coalesce(1)
        return tagged.groupBy(*self._groups).agg(*self._sums).select(*self._moves)

    def kept_state(self, combined: DataFrame) -> DataFrame:
        """The state after, from :meth:`next_state`: the groups that still have rows (without
        ``GROUP BY``, the one group, which has its row even with none)."""
        return combined.where(self._has_rows).select(*self._state_columns)

    def updates(self, combined: DataFrame) -> DataFrame:
        """The output rows that :meth:`next_state` retracts (diff -1) and adds (+1), in one pass
        over it."""
        return combined.where(self._moved).select(self._updates)

    def key_moving_updates(self, combined: DataFrame) -> DataFrame:
        """The updates of :meth:`updates` that may change the row count of a key of the view
        (:meth:`next_state`'s flag): their keys are every key whose count changes (and maybe a few
        whose count does not)."""
        return self.updates(combined.where(F.col(_KEY_MOVES)))

    def output(self, state: DataFrame) -> DataFrame:
        """The query's result held by ``state``."""
        return state.select(*self._output)

    def _state_row(self, diff: int) -> list[Column]:
        """The columns of :meth:`rows_as_state` at ``diff``."""
        d = F.lit(diff).cast("long")
        nonnull = lambda column: F.when(F.col(column).isNotNull(), d).otherwise(F.lit(0).cast("long"))  # noqa: E731
        columns = [F.col(g).alias(group_column(i)) for i, g in enumerate(self.aggregate.groups)] + [d.alias(ROWS)]
        for i, out in enumerate(self.aggregate.outputs):
            if out.kind == "count":
                columns.append(nonnull(out.column).alias(value_column(i)))
            elif out.kind in ("sum", "avg"):
                value = F.col(out.column).cast(out.kept_as) if out.kept_as else F.col(out.column)
                columns += [(value if diff > 0 else -value).alias(value_column(i)), nonnull(out.column).alias(nonnull_column(i))]
        return columns

    def _output_values(self, schema: T.StructType, name) -> list[Column]:
        """The output columns' values (cast to ``schema``'s types) from the state columns
        ``name(column)``."""
        values = []
        for i, (out, field) in enumerate(zip(self.aggregate.outputs, schema.fields)):
            if out.kind == "group":
                value = F.col(group_column(self.aggregate.groups.index(out.column)))
            elif out.kind == "rows":  # 0, not null, over no rows (the one row of a query without GROUP BY)
                value = F.coalesce(F.col(name(ROWS)), F.lit(0))
            elif out.kind == "count":
                value = F.coalesce(F.col(name(value_column(i))), F.lit(0))
            elif out.kind == "sum":
                value = F.when(F.col(name(nonnull_column(i))) > 0, F.col(name(value_column(i))))
            else:
                count = F.col(name(nonnull_column(i)))
                value = F.when(count > 0, self._average(out.average, F.col(name(value_column(i))), count))
            values.append(value.cast(field.dataType))
        return values

    @staticmethod
    def _average(average: Average, total: Column, count: Column) -> Column:
        """An average from its sum and count of non-null values (count > 0), as :class:`Average`
        says Spark computes it."""
        if average.how == "double":
            return total.cast("double") / count.cast("double")
        if average.how == "unscaled":
            return total.cast("double") / count.cast("double") / F.lit(average.divisor)
        jvm = SparkContext._active_spark_context._jvm
        utils = jvm.org.apache.spark.sql.classic.ExpressionUtils
        divided = jvm.org.apache.spark.sql.catalyst.expressions.DecimalDivideWithOverflowCheck(
            utils.expression(total.cast(average.sum_type)._jc), utils.expression(count.cast("decimal(20,0)")._jc),
            jvm.org.apache.spark.sql.types.DecimalType(*average.result), None, average.null_on_overflow)
        return ClassicColumn(utils.column(divided))


def linear_aggregate(result: DataFrame, scan: str, sources: int = 1, top: bool = False) -> LinearAggregate | None:
    """The shape of ``result`` (a query over ``sources`` ``scan`` leaves) if it is a linear
    aggregate (with ``top``: maybe under a top, :func:`aggregate_shape`)."""
    shape = aggregate_shape(result, top)
    if shape is None:
        return None
    child = under_row_wise(result).child()  # its Aggregate's (a shape: deterministic, no subquery)
    return shape if (plan_is_row_wise(child, scan) if sources == 1
                     else plan_is_inner_join(child, scan, sources)) else None


def aggregate_over_outer_join(result: DataFrame, scan: str, sources: int, top: bool = False
                              ) -> tuple[LinearAggregate, list] | tuple[None, None]:
    """The shape of ``result`` (``top`` as for :func:`aggregate_shape`) if it is a linear aggregate
    over an outer join that it reads as an inner join plus the kept side
    (:mod:`mvsink.desired.outer_join`: no ``count(*)``, the others' arguments null on the padded
    side), and the padded side's leaves; else ``(None, None)``."""
    shape = aggregate_shape(result, top)
    if shape is None or any(out.kind == "rows" for out in shape.outputs):
        return None, None
    aggregate = under_row_wise(result)
    leaves = padded_leaves(aggregate, _arguments(aggregate), scan, sources)
    return (shape, leaves) if leaves is not None else (None, None)


def aggregate_of_groups(result: DataFrame, scan: str, names: dict[int, str] | None = None, top: bool = False
                        ) -> tuple[LinearAggregate, PerGroup] | tuple[None, None]:
    """The shape of ``result`` if it is a linear aggregate (``top`` as for :func:`aggregate_shape`)
    over a per-group query (an aggregate of an aggregate, an aggregate over an outer join:
    :func:`~mvsink.desired.per_group.per_group` over ``scan`` leaves, named by ``names``), and that
    query's shape; else ``(None, None)``."""
    shape = aggregate_shape(result, top)
    inner = per_group(shape.aggregate_input(result), scan, names) if shape is not None else None
    return (shape, inner) if inner is not None else (None, None)


def aggregate_of_aggregate(result: DataFrame, scan: str, sources: int = 1, top: bool = False
                           ) -> tuple[LinearAggregate, LinearAggregate, list | None] | tuple[None, None, None]:
    """The shapes of ``result`` (``top`` as for :func:`aggregate_shape`) and of the query below its
    ``Aggregate`` if that is a linear aggregate (a rollup: sums of sums, counts of groups; maybe
    under a top of its own, which holds any expression of its columns the one above reads; maybe
    over an outer join, :func:`aggregate_over_outer_join`) and ``result`` a linear aggregate of its
    output columns as they are (no expression: it reads the rows the one below outputs), and the
    padded side's leaves of the one below's outer join (None: it has none); else ``(None, None, None)``."""
    outer = aggregate_shape(result, top)
    if outer is None or any(out.expression is not None for out in outer.outputs):
        return None, None, None
    below_query = outer.aggregate_input(result)
    below = linear_aggregate(below_query, scan, sources, top=True)
    if below is not None:
        return outer, below, None
    below, leaves = aggregate_over_outer_join(below_query, scan, sources, top=True) if sources > 1 else (None, None)
    return (outer, below, leaves) if below is not None else (None, None, None)


def recomputed_shape(result: DataFrame, scan: str, sources: int = 1) -> LinearAggregate | None:
    """The shape of ``result`` (a query over ``sources`` ``scan`` leaves) if it is one ``Aggregate``
    (no top) grouping by columns over a row-wise query or an inner join, whose outputs are those of
    a linear aggregate or ``min``, ``max`` (kinds ``min``, ``max``) and ``count(DISTINCT x)`` (kind
    ``distinct``; one such argument in all) of a column or expression of a type whose order and
    equality Arrow has as Spark has them (:data:`RECOMPUTED_TYPES`: no floating point, no
    collation): an aggregate whose changed groups are recomputed from its input's rows
    (:mod:`mvsink.desired.arrow_recompute`)."""
    shape = _plain_shape(result, recomputed=True)
    if shape is None or len({o.column for o in shape.outputs if o.kind == "distinct"}) > 1:
        return None
    child = result._jdf.queryExecution().optimizedPlan().child()
    return shape if (plan_is_row_wise(child, scan) if sources == 1
                     else plan_is_inner_join(child, scan, sources)) else None


def aggregate_shape(result: DataFrame, top: bool = False) -> LinearAggregate | None:
    """The shape of ``result`` if its optimized plan is a linear ``Aggregate`` over any input
    (deterministic, reading no subquery): the caller says how that input's changes are had. With
    ``top``, else the shape of its :func:`~mvsink.desired.aggregate_top.aggregate_core` if that is
    one (``top`` set: the query is a row-wise top over it, with expressions of its aggregates)."""
    shape = _plain_shape(result)
    if shape is not None or not top:
        return shape
    core = aggregate_core(result)
    shape = _plain_shape(core) if core is not None else None
    return replace(shape, top=True) if shape is not None else None


def _plain_shape(result: DataFrame, recomputed: bool = False) -> LinearAggregate | None:
    """The shape of ``result`` if its optimized plan is a linear ``Aggregate`` (with
    ``recomputed``, one of :func:`recomputed_shape`), with no top."""
    plan = result._jdf.queryExecution().optimizedPlan()
    if plan.nodeName() != "Aggregate" or not plan.deterministic() or plan_reads_subqueries(result, plan):
        return None
    groups = []
    for expr in _seq(plan.groupingExpressions()):
        if _kind(expr) != "AttributeReference":
            return None
        groups.append(expr.name())
    if len(set(_attribute_names(plan.child()))) != len(_attribute_names(plan.child())):
        return None
    outputs = []
    for expr in _seq(plan.aggregateExpressions()):
        name = expr.name()
        if _kind(expr) == "Alias":
            expr = expr.child()
        if _kind(expr) == "AttributeReference":
            if expr.name() not in groups:
                return None
            outputs.append(Output(name, "group", expr.name()))
            continue
        out = _aggregate(expr, name, len(outputs), recomputed)
        if out is None:
            return None
        outputs.append(out)
    return LinearAggregate(tuple(groups), tuple(outputs))


def _aggregate(expr, name: str, index: int, recomputed: bool = False) -> Output | None:
    """The :class:`Output` of output ``index``'s expression, if it is a linear aggregate (with
    ``recomputed``, or ``min``, ``max``, ``count(DISTINCT x)``)."""
    function, divisor = _function(expr, distinct=recomputed)
    if function is None:
        return None
    arguments = _seq(function.children())
    distinct = recomputed and _kind(expr) == "AggregateExpression" and expr.isDistinct()
    if recomputed and _kind(function) in ("Min", "Max") or distinct:
        kind = "distinct" if distinct else _kind(function).lower()
        if ((kind == "distinct") != (_kind(function) == "Count") or len(arguments) != 1
                or arguments[0].dataType().json() not in RECOMPUTED_TYPES
                and not arguments[0].dataType().json().startswith('"decimal(')):
            return None
        (argument,) = arguments
        column, expression = ((argument.name(), None) if _kind(argument) == "AttributeReference"
                              else (_input(index), argument.sql()))
        return Output(name, kind, column, expression=expression)
    if _kind(function) == "Count" and len(arguments) == 1:
        (argument,) = arguments
        if _kind(argument) == "Literal" and not argument.nullable():
            return Output(name, "rows", None)
        if _kind(argument) == "AttributeReference":
            return Output(name, "count", argument.name())
    if _kind(function) not in ("Sum", "Average") or len(arguments) != 1:
        return None
    (argument,) = arguments
    data_type = T._parse_datatype_json_string(argument.dataType().json())
    if not isinstance(data_type, _EXACT_SUM_TYPES):
        return None
    kept_as = None if isinstance(data_type, T.DecimalType) else "decimal(38,0)"
    column, expression = ((argument.name(), None) if _kind(argument) == "AttributeReference"
                          else (_input(index), argument.sql()))
    if _kind(function) == "Sum":
        return Output(name, "sum", column, kept_as, expression)
    return Output(name, "avg", column, kept_as, expression, _average_of(function, data_type, divisor))


def _function(expr, distinct: bool = False) -> tuple:
    """``(function, divisor)``: the aggregate function of ``expr`` where it is a plain (complete,
    unfiltered; distinct only with ``distinct``) one, else None; and where ``expr`` is the optimizer's rewrite of a
    decimal ``avg``, ``CAST(avg(UnscaledValue(x)) / divisor AS decimal(...))``, that ``avg`` and
    its divisor (else None)."""
    divisor = None
    if _kind(expr) == "Cast" and _kind(expr.child()) == "Divide" and _kind(expr.child().right()) == "Literal":
        expr, divisor = expr.child().left(), float(expr.child().right().value())
    if (_kind(expr) != "AggregateExpression" or expr.isDistinct() and not distinct or expr.filter().isDefined()
            or expr.mode().toString() != "Complete"):
        return None, None
    function = expr.aggregateFunction()
    if divisor is not None and (_kind(function) != "Average" or _kind(function.child()) != "UnscaledValue"):
        return None, None
    return function, divisor


def _average_of(function, data_type: T.DataType, divisor: float | None) -> Average:
    """How Spark computes ``function`` (an ``Average`` of ``data_type``, its result divided by
    ``divisor`` if not None): see :class:`Average`."""
    if divisor is not None:
        return Average("unscaled", divisor=divisor)
    if not isinstance(data_type, T.DecimalType):
        return Average("double")
    result = function.dataType()
    return Average("decimal", f"decimal({min(38, data_type.precision + 10)},{data_type.scale})",
                   (result.precision(), result.scale()), function.evalMode().toString() != "ANSI")


def aggregate_arguments(core: DataFrame) -> list:
    """The argument of each output's aggregate function in ``core``'s optimized plan (an
    ``Aggregate``; None for a grouping column or ``count(*)``), as Catalyst expressions."""
    return _arguments(core._jdf.queryExecution().optimizedPlan())


def _arguments(plan) -> list:
    """The argument of each output's aggregate function in ``plan`` (an ``Aggregate``; None for a
    grouping column or ``count(*)``)."""
    arguments = []
    for expr in _seq(plan.aggregateExpressions()):
        function, _ = _function(expr.child() if _kind(expr) == "Alias" else expr, distinct=True)
        children = _seq(function.children()) if function is not None else []
        arguments.append(children[0] if len(children) == 1 else None)
    return arguments


def _kind(expr) -> str:
    return expr.getClass().getSimpleName()


def _seq(scala_seq) -> list:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _attribute_names(plan) -> list[str]:
    return [a.name() for a in _seq(plan.output())]


def group_column(i: int) -> str:
    return f"_mv_g{i}"


def value_column(i: int) -> str:
    return f"_mv_a{i}"


def _input(i: int) -> str:
    return f"_mv_in{i}"


def nonnull_column(i: int) -> str:
    return f"_mv_nn{i}"


def _before(column: str) -> str:
    return f"{column}_before"
