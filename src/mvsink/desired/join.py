"""Whether a snapshot view's query is an *inner join* of its sources, maintained from their changes.

A query is an inner join here when its optimized logical plan is projections, filters and inner
joins (``Project``, ``Filter``, ``Join`` of type inner or cross: an equi-join with any extra
condition) over one scan per source, every source read exactly once, every expression
deterministic, and no subquery. Such a query ``Q`` is linear in each source: over multisets of
rows with diffs, ``Q(.., A + D, ..) = Q(.., A, ..) + Q(.., D, ..)``. So between two times, with the
sources ``A1..An`` at their versions before and ``A1'..An'`` after, and ``Di = Ai' - Ai`` source
``i``'s change,

    ``Q(A1', .., An') - Q(A1, .., An) = sum over i of Q(A1', .., A(i-1)', Di, A(i+1), .., An)``

(the delta rule ``D(A join B) = DA join B + A' join DB``): each term is the query over source
``i``'s change (its inserted rows at +1, its deleted rows at -1, as for a row-wise query) and the
other sources, those before ``i`` at the time's versions and those after it at the versions before.
A source whose version did not move has no term. The work is each change joined with the other sides
(Spark broadcasts a small change); no earlier result is kept. A linear aggregate over such a join
(:mod:`mvsink.desired.linear_aggregate`) moves its groups by the same terms. A source read twice (a
self-join) makes the query quadratic in it, an outer join is not linear: such queries, and any other
shape, are evaluated in full.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from mvsink.desired.row_wise import plan_reads_subqueries

#: Plan nodes over which a query stays linear in each source: row-wise nodes and inner joins.
_LINEAR_NODES = frozenset({"Project", "Filter", "Join"})
_INNER_JOINS = frozenset({"Inner", "Cross"})


def is_inner_join(result: DataFrame, scan: str, sources: int) -> bool:
    """Whether ``result`` is an inner join (see the module doc) of ``sources`` leaves, each a
    ``scan`` node (:data:`~mvsink.desired.row_wise.TABLE_SCAN` or
    :data:`~mvsink.desired.row_wise.HELD_ROWS`), at least one join among them."""
    plan = result._jdf.queryExecution().optimizedPlan()
    return plan.deterministic() and not plan_reads_subqueries(result, plan) and plan_is_inner_join(plan, scan, sources)


def plan_is_inner_join(plan, scan: str, sources: int) -> bool:
    """Whether the logical ``plan`` is linear nodes, at least one join, over ``sources`` ``scan``
    leaves (determinism, subqueries and which leaf is which aside)."""
    leaves, joins = _linear_leaves(plan)
    return (leaves is not None and joins > 0 and len(leaves) == sources
            and all(leaf.nodeName() == scan and leaf.children().isEmpty() for leaf in leaves))


def reads_each_once(result: DataFrame, held: list[DataFrame]) -> bool:
    """Whether the leaves of ``result``'s plan (an inner join, or a linear aggregate over one)
    are the rows ``held`` (each a local checkpoint), each exactly once: the query reads what it
    is given, nothing twice."""
    plan = result._jdf.queryExecution().optimizedPlan()
    leaves, _ = _linear_leaves(plan.child() if plan.nodeName() == "Aggregate" else plan)
    ids = sorted(leaf.rdd().id() for leaf in leaves or [])
    return ids == sorted(rows._jdf.queryExecution().optimizedPlan().rdd().id() for rows in held)


def _linear_leaves(plan) -> tuple[list | None, int]:
    """The leaves under the linear nodes of ``plan`` and how many joins there are; None for
    the leaves if some other node or join type is among them."""
    leaves, joins, pending = [], 0, [plan]
    while pending:
        node = pending.pop()
        name = node.nodeName()
        if name == "Join":
            if node.joinType().toString() not in _INNER_JOINS:
                return None, joins
            joins += 1
        elif name not in _LINEAR_NODES:
            leaves.append(node)
            continue
        children = node.children()
        pending += [children.apply(i) for i in range(children.size())]
    return leaves, joins
