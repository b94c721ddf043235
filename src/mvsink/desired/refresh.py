"""A query view's refresh policy, and why a query cannot be maintained from its sources' changes.

``auto`` (the default) maintains the query from its sources' changes where its shape allows
(row-wise, linear aggregate, inner join, union all, per-group aggregate:
:mod:`mvsink.desired.snapshot`) and evaluates it in full otherwise; ``incremental`` refuses at start
a query that cannot be maintained, naming the first operator of its plan that none of those
strategies maintains (:func:`unmaintained_operator`); ``full`` evaluates every query in full.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from mvsink.desired.row_wise import plan_reads_subqueries

#: Plan nodes some strategy maintains (an ``Aggregate`` only at or near the top; a ``Union``: ``UNION ALL``).
_MAINTAINED = frozenset({"Project", "Filter", "Join", "Union", "Aggregate"})
_INNER_JOINS = frozenset({"Inner", "Cross"})


def unmaintained_operator(result: DataFrame) -> str:
    """The first part of ``result``'s optimized plan (a query no strategy maintains) that stops
    it, for a user: an operator by its Spark name, an outer join by its type, or what else."""
    plan = result._jdf.queryExecution().optimizedPlan()
    if not plan.deterministic():
        return "a non-deterministic expression"
    if plan_reads_subqueries(result, plan):
        return "a subquery"
    pending, joins, aggregates, scans = [plan], 0, 0, 0
    while pending:
        node = pending.pop()
        name = node.nodeName()
        if name == "Join" and node.joinType().toString() not in _INNER_JOINS:
            return f"a {node.joinType().toString()} Join"
        if name not in _MAINTAINED:
            if not node.children().isEmpty():
                return name
            scans += 1
            continue
        joins, aggregates = joins + (name in ("Join", "Union")), aggregates + (name == "Aggregate")
        children = node.children()
        pending += [children.apply(i) for i in range(children.size())]
    if aggregates:
        return ("an Aggregate that is neither count/sum/avg of integers or decimals grouped by columns nor "
                "order-free aggregates of one source grouped by its columns")
    return "a source read twice" if joins else f"the plan {plan.nodeName()} over {scans} scans"
