"""Whether a snapshot view's query is a *per-group* aggregate, and its changes by recomputing the changed groups.

A query is a per-group aggregate when its optimized logical plan is one ``Aggregate`` (under any
projections and filters: ``HAVING``, expressions of aggregates) that groups by columns (at least
one), each a column of its one source passed through unchanged
(:func:`~mvsink.desired.row_wise.leaf_columns`), over a row-wise query of that source
(:mod:`mvsink.desired.row_wise`), every expression deterministic, no subquery, and every aggregate
function one whose result does not depend on the order of its rows (:data:`ORDER_FREE`: ``min``,
``max``, ``count`` and ``count(DISTINCT ...)``, ``percentile``, and ``sum`` and ``avg`` of integers
and decimals (:data:`EXACT_INPUT`); not ``first``, ``collect_list``, ``max_by``, nor sums, averages
and deviations of floating point, whose last bits depend on how Spark splits the rows among tasks).
A linear aggregate
(:mod:`mvsink.desired.linear_aggregate`) keeps its own strategy; this one takes the others.

Each output row then depends on the source rows of one group only (the rows whose grouping
columns have one value; a null is a value: a group). With ``G(t)`` the distinct grouping values of
the source's rows changed at time ``t`` (inserted and deleted), every group outside ``G(t)`` has
the same rows at ``t`` as at the time before, so the same output rows: the view's change at ``t``
is the query over the source at ``t``'s version restricted to ``G(t)`` at +1, and over the version
before restricted to ``G(t)`` at -1, consolidated. The restriction is applied to the source's rows,
below the aggregate (:func:`in_groups`, null-safe), after the read is pruned to a few ranges of
``G``'s values (:func:`~mvsink.desired.join.pruned`), so Delta skips the files of other groups
(:class:`~mvsink.desired.snapshot.SnapshotDesired` reads the changes and the ranges once per step).

Invariant: the rows retracted for a group at ``t`` are the rows the group had, recomputed from the
version before; they equal the rows added for it earlier, because every aggregate taken gives the
same result however Spark splits the rows among tasks (a floating-point sum would not: which files
a step's read prunes changes the split, and a retraction off in its last bit would leave the old row
in the view). An average of integers is a sum of doubles in Spark, exact while the sums stay within
2**53, as for a linear aggregate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mvsink.desired.row_wise import ROW_WISE_NODES, leaf_columns, plan_is_row_wise, plan_reads_subqueries, scala_items

#: Aggregate functions (Catalyst's names) whose result does not depend on the order of the rows.
ORDER_FREE = frozenset({"Min", "Max", "Count", "Percentile", "HyperLogLogPlusPlus"})
#: ... and those whose result does not where their input is exact (integral or decimal), not
#: floating point.
EXACT_INPUT = frozenset({"Sum", "Average"})
_FLOATING = frozenset({"float", "double"})


@dataclass(frozen=True)
class PerGroup:
    """The shape of a per-group aggregate: the source's columns it groups by."""

    columns: tuple[str, ...]


def per_group(result: DataFrame, scan: str) -> PerGroup | None:
    """The shape of ``result`` (a query over one ``scan`` leaf) if it is a per-group aggregate."""
    plan = result._jdf.queryExecution().optimizedPlan()
    if not plan.deterministic() or plan_reads_subqueries(result, plan):
        return None
    node = plan
    while node.nodeName() in ROW_WISE_NODES:
        node = node.children().head()
    if node.nodeName() != "Aggregate" or not plan_is_row_wise(node.child(), scan):
        return None
    groups = scala_items(node.groupingExpressions())
    if not groups or any(g.nodeName() != "AttributeReference" for g in groups):
        return None
    if not all(_order_free(f) for e in scala_items(node.aggregateExpressions()) for f in _functions(e)):
        return None
    columns = leaf_columns(node.child(), [g.exprId().id() for g in groups])
    return PerGroup(columns) if columns is not None else None


def _functions(expression) -> list:
    """The aggregate functions in ``expression`` (Catalyst's)."""
    if expression.nodeName() == "AggregateExpression":
        return [expression.aggregateFunction()]
    return [function for child in scala_items(expression.children()) for function in _functions(child)]


def _order_free(function) -> bool:
    """Whether ``function``'s result is the same in any order of its rows (:data:`ORDER_FREE`,
    :data:`EXACT_INPUT`)."""
    name = function.nodeName()
    if name in EXACT_INPUT:
        return all(child.dataType().typeName() not in _FLOATING for child in scala_items(function.children()))
    return name in ORDER_FREE


def in_groups(rows: DataFrame, groups: DataFrame, columns: tuple[str, ...], small: bool) -> DataFrame:
    """``rows`` whose ``columns`` equal those of a row of ``groups`` (its distinct values of
    them), nulls equal to nulls: a semi-join (``groups`` broadcast if ``small``)."""
    condition = reduce(lambda a, b: a & b, [rows[c].eqNullSafe(groups[c]) for c in columns])
    return rows.join(F.broadcast(groups) if small else groups, condition, "left_semi")
