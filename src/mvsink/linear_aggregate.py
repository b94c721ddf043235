"""Whether a snapshot view's query is a *linear aggregate*, and its changes from its source's changes.

A query is a linear aggregate when its optimized logical plan is one ``Aggregate`` that groups by
columns (at least one) and computes only ``count(*)``, ``count(column)`` and ``sum(column)`` of an
integral or decimal column, over a row-wise query (:mod:`mvsink.row_wise`: projections and filters
of one scan). Each output column is a grouping column or one such aggregate.

Such aggregates add up: over a multiset of rows each with a diff, a group's count is the sum of
the diffs and its sum the sum of value times diff. So the view keeps a *state*, per group: its row
count ``n``, and per output column its count or its sum with the count of its non-null values
(a sum of none is null). The state at a time plus the aggregates of the source's change feed (the
row-wise part applied to inserted rows at +1 and deleted rows at -1) is the state at the next
time, computed in one grouping of both; the group's output row before and after is its change
(-1, +1; a group whose count falls to 0 is gone). The work follows the change and the groups, not
the source. Sums of floating point (order-dependent), averages, min/max, distinct aggregates,
``HAVING`` and aggregates without ``GROUP BY`` are not linear aggregates: they are recomputed.

Invariant: the output rows of the state at a time are exactly the query's result at that time's
versions (each column cast to the query's type).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink.row_wise import plan_is_row_wise, plan_reads_subqueries

#: State columns: each group column, the group's row count, each aggregate's value and non-nulls.
_N, _TOUCHED = "_mv_n", "_mv_touched"
_EXACT_SUM_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType)


@dataclass(frozen=True)
class Output:
    """One output column: ``kind`` is ``group`` (``column`` is the grouping column), ``rows``
    (``count(*)``), ``count`` or ``sum`` (of ``column``, a column of the aggregate's input).
    A sum of integers is kept as ``decimal(38,0)``: negating a deleted row's value, or a sum on
    the way, cannot overflow where the query's own sum would not."""

    name: str
    kind: str
    column: str | None
    kept_as: str | None = None


@dataclass(frozen=True)
class LinearAggregate:
    """The shape of a linear aggregate query: its grouping columns and output columns."""

    groups: tuple[str, ...]
    outputs: tuple[Output, ...]

    def aggregate_input(self, result: DataFrame) -> DataFrame:
        """The rows the ``Aggregate`` of ``result`` (this query over some rows) groups: its
        row-wise input, as a DataFrame."""
        plan = result._jdf.queryExecution().optimizedPlan()
        spark = result.sparkSession
        jvm = spark.sparkContext._jvm
        return DataFrame(jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, plan.child()), spark)

    def rows_as_state(self, rows: DataFrame, diff: int) -> DataFrame:
        """``rows`` (the aggregate's input rows), each at ``diff``, as a state of one row each
        (not grouped: :meth:`state` and :meth:`next_state` sum them per group)."""
        d = F.lit(diff).cast("long")
        nonnull = lambda column: F.when(F.col(column).isNotNull(), d).otherwise(F.lit(0).cast("long"))  # noqa: E731
        columns = [F.col(g).alias(_group(i)) for i, g in enumerate(self.groups)] + [d.alias(_N)]
        for i, out in enumerate(self.outputs):
            if out.kind == "count":
                columns.append(nonnull(out.column).alias(_value(i)))
            elif out.kind == "sum":
                value = F.col(out.column).cast(out.kept_as) if out.kept_as else F.col(out.column)
                value = value if diff > 0 else -value
                columns += [value.alias(_value(i)), nonnull(out.column).alias(_nonnull(i))]
        return rows.select(*columns)

    def state(self, rows: DataFrame) -> DataFrame:
        """The state of ``rows`` (the aggregate's input rows): one row per group."""
        return self.rows_as_state(rows, 1).groupBy(*self._group_columns()).agg(
            *[F.sum(c).alias(c) for c in self._state_columns()])

    def next_state(self, state: DataFrame, changed_rows: DataFrame) -> DataFrame:
        """Per group of ``state`` or ``changed_rows`` (from :meth:`rows_as_state`): its state before
        and after them, and whether they touch it. Null group values group together, as in the
        query; one grouping of both, one shuffle."""
        tagged = state.withColumn(_TOUCHED, F.lit(False)).unionByName(changed_rows.withColumn(_TOUCHED, F.lit(True)))
        sums = [F.sum(F.when(~F.col(_TOUCHED), F.col(c))).alias(_before(c)) for c in self._state_columns()]
        sums += [F.sum(c).alias(c) for c in self._state_columns()]
        return tagged.groupBy(*self._group_columns()).agg(*sums, F.max(_TOUCHED).alias(_TOUCHED))

    def kept_state(self, combined: DataFrame) -> DataFrame:
        """The state after, from :meth:`next_state`: the groups that still have rows."""
        return combined.where(F.col(_N) > 0).select(*self._group_columns(), *self._state_columns())

    def changed_rows(self, combined: DataFrame, schema: T.StructType) -> tuple[DataFrame, DataFrame]:
        """The output rows of the touched groups of :meth:`next_state`: before (to retract) and
        after (to add), in ``schema`` (the query's columns and types)."""
        touched = combined.where(F.col(_TOUCHED))
        before = touched.where(F.coalesce(F.col(_before(_N)), F.lit(0)) > 0)
        after = touched.where(F.col(_N) > 0)
        return (before.select(*self._output_columns(schema, _before)),
                after.select(*self._output_columns(schema, lambda c: c)))

    def output(self, state: DataFrame, schema: T.StructType) -> DataFrame:
        """The query's result held by ``state``."""
        return state.select(*self._output_columns(schema, lambda c: c))

    def _group_columns(self) -> list[str]:
        return [_group(i) for i in range(len(self.groups))]

    def _state_columns(self) -> list[str]:
        columns = [_N]
        for i, out in enumerate(self.outputs):
            columns += {"count": [_value(i)], "sum": [_value(i), _nonnull(i)]}.get(out.kind, [])
        return columns

    def _output_columns(self, schema: T.StructType, name) -> list[Column]:
        columns = []
        for i, (out, field) in enumerate(zip(self.outputs, schema.fields)):
            if out.kind == "group":
                value = F.col(_group(self.groups.index(out.column)))
            elif out.kind == "rows":
                value = F.col(name(_N))
            elif out.kind == "count":
                value = F.col(name(_value(i)))
            else:
                value = F.when(F.col(name(_nonnull(i))) > 0, F.col(name(_value(i))))
            columns.append(value.cast(field.dataType).alias(field.name))
        return columns


def linear_aggregate(result: DataFrame, scan: str) -> LinearAggregate | None:
    """The shape of ``result`` (a query over one ``scan`` leaf) if it is a linear aggregate."""
    plan = result._jdf.queryExecution().optimizedPlan()
    if plan.nodeName() != "Aggregate" or not plan.deterministic() or plan_reads_subqueries(result, plan):
        return None
    if not plan_is_row_wise(plan.child(), scan):
        return None
    groups = []
    for expr in _seq(plan.groupingExpressions()):
        if _kind(expr) != "AttributeReference":
            return None
        groups.append(expr.name())
    if not groups or len(set(_attribute_names(plan.child()))) != len(_attribute_names(plan.child())):
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
        out = _aggregate(expr, name)
        if out is None:
            return None
        outputs.append(out)
    return LinearAggregate(tuple(groups), tuple(outputs))


def _aggregate(expr, name: str) -> Output | None:
    """The :class:`Output` of an aggregate expression, if it is a linear one."""
    if (_kind(expr) != "AggregateExpression" or expr.isDistinct() or expr.filter().isDefined()
            or expr.mode().toString() != "Complete"):
        return None
    function = expr.aggregateFunction()
    arguments = _seq(function.children())
    if _kind(function) == "Count" and len(arguments) == 1:
        (argument,) = arguments
        if _kind(argument) == "Literal" and not argument.nullable():
            return Output(name, "rows", None)
        if _kind(argument) == "AttributeReference":
            return Output(name, "count", argument.name())
    if _kind(function) == "Sum" and len(arguments) == 1:
        (argument,) = arguments
        data_type = T._parse_datatype_json_string(argument.dataType().json())
        if _kind(argument) == "AttributeReference" and isinstance(data_type, _EXACT_SUM_TYPES):
            kept_as = None if isinstance(data_type, T.DecimalType) else "decimal(38,0)"
            return Output(name, "sum", argument.name(), kept_as)
    return None


def _kind(expr) -> str:
    return expr.getClass().getSimpleName()


def _seq(scala_seq) -> list:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _attribute_names(plan) -> list[str]:
    return [a.name() for a in _seq(plan.output())]


def _group(i: int) -> str:
    return f"_mv_g{i}"


def _value(i: int) -> str:
    return f"_mv_a{i}"


def _nonnull(i: int) -> str:
    return f"_mv_nn{i}"


def _before(column: str) -> str:
    return f"{column}_before"
