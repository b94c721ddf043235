"""Whether a linear aggregate's input is an *outer join* it reads as an inner join plus the kept side.

A left outer join ``K LEFT JOIN P ON c`` has a row for each pair of rows of ``K`` and ``P`` that
satisfy ``c`` (the inner join's rows) and, for each row of ``K`` that matches none, that row with
``P``'s columns null (*padded*). Take a linear aggregate (:mod:`mvsink.desired.linear_aggregate`)
over it grouped by columns not computed from ``P``'s, with no ``count(*)``, whose every other
aggregate (``count(x)``, ``sum(x)``, ``avg(x)``) reads an ``x`` that is null wherever ``P``'s
columns are: ``x`` a column of ``P``, or built from one by functions that are null on a null
(``l_extendedprice * (1 - l_discount)``, not ``coalesce``). Replacing the padded rows by *every*
row of ``K`` with ``P``'s columns null changes none of its groups: those rows add nothing to a count
or a sum of ``x`` (nor to an average's), and a group has one of them exactly where it has a row
of the join (each row of ``K`` is in some row of the join, with its values of the grouping
columns). So over multisets the aggregate is that of

    ``I(K, P) + O(K)``

with ``I`` the query with the outer join made inner (:func:`inner_joined`) and ``O`` the query with
``P``'s sources given no rows (every row of ``K`` padded). Both are linear in each source: ``I`` is
an inner join (:mod:`mvsink.desired.join`), ``O`` reads ``K`` alone. So the aggregate's state moves,
per source whose version moves, by ``I``'s term of its change (the delta rule, the other sides
pruned by ``I``'s equalities, the outer join's among them) and, for a source of ``K``, by ``O`` over
its change; a group's count of rows is that of ``I + O``, not 0 exactly where the view has the
group. A right outer join is the same with its sides swapped.

Taken where the plan below the ``Aggregate`` is projections, filters and inner joins over one scan
per source and exactly one outer join (no union; ``P`` may itself be an inner join), and no filter
or join condition above the outer join reads a column computed from ``P``'s (it would tell the
padded rows apart, as ``WHERE o_orderkey IS NULL`` does). Rows an inner join above matches with
``K``'s columns are matched alike in both forms.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from mvsink.desired.aggregate_top import Catalyst
from mvsink.desired.join import INNER_JOINS, linear_leaves
from mvsink.desired.row_wise import plan_leaves, references, scala_items

#: Outer join types taken, and the side (0: left, 1: right) each pads with nulls.
_PADDED_SIDE = {"LeftOuter": 1, "RightOuter": 0}


def padded_leaves(aggregate, arguments: list, scan: str, sources: int) -> list | None:
    """The leaves of the padded side of the one outer join under ``aggregate`` (an ``Aggregate``
    node, a linear aggregate's, with no ``count(*)``: ``arguments`` are its outputs' aggregated
    expressions, None for a grouping column) if the module doc's shape holds: ``sources`` ``scan``
    leaves under inner joins and that join, the groups and conditions above it not reading the
    padded side, each argument null wherever the padded side is; else None."""
    child = aggregate.child()
    leaves, _ = linear_leaves(child, INNER_JOINS | frozenset(_PADDED_SIDE))
    if (leaves is None or len(leaves) != sources
            or not all(leaf.nodeName() == scan and leaf.children().isEmpty() for leaf in leaves)):
        return None
    path = _path_to_outer_join(child)
    if path is None:
        return None
    join = path[-1]
    padded = scala_items(join.children())[_PADDED_SIDE[join.joinType().toString()]]
    tainted = {a.exprId().id() for a in scala_items(padded.output())}
    strict = set(tainted)
    for node in reversed(path[:-1]):  # upwards from the join: what each node computes from the padded side
        name = node.nodeName()
        if name == "Project":
            for named in scala_items(node.projectList()):
                if named.nodeName() == "Alias":
                    if references(named.child()) & tainted:
                        tainted.add(named.exprId().id())
                    if _null_where_padded(named.child(), strict):
                        strict.add(named.exprId().id())
        elif name == "Filter" and references(node.condition()) & tainted:
            return None
        elif name == "Join" and node.condition().isDefined() and references(node.condition().get()) & tainted:
            return None
    if any(references(g) & tainted for g in scala_items(aggregate.groupingExpressions())):
        return None
    if not all(argument is None or _null_where_padded(argument, strict) for argument in arguments):
        return None
    return plan_leaves(padded)


def inner_joined(result: DataFrame) -> DataFrame:
    """``result`` with each outer join of its optimized plan made an inner join (the same
    condition): ``I`` of the module doc. ``result`` as it is where it has none."""
    nodes = Catalyst(result.sparkSession.sparkContext._jvm)
    plan = nodes.rejoined(result._jdf.queryExecution().optimizedPlan(),
                          lambda join: "Inner" if join.joinType().toString() in _PADDED_SIDE else None)
    return nodes.frame(result, plan) if plan is not None else result


def _path_to_outer_join(plan) -> list | None:
    """The nodes from ``plan`` down to its one outer join (the last), through projections,
    filters and inner joins; None where there is not exactly one, or a union."""
    found: list[list] = []

    def walk(node, path: list) -> None:
        name = node.nodeName()
        if name == "Union":
            found.extend([None, None])  # refused
            return
        path = [*path, node]
        if name == "Join" and node.joinType().toString() in _PADDED_SIDE:
            found.append(path)
        for child in scala_items(node.children()):
            walk(child, path)

    walk(plan, [])
    return found[0] if len(found) == 1 else None


def _null_where_padded(expression, padded: set[int]) -> bool:
    """Whether ``expression`` is null wherever the attributes of ids ``padded`` are: one of them,
    or a function that is null on a null input (Catalyst's ``nullIntolerant``) of such an expression."""
    if expression.nodeName() == "AttributeReference":
        return expression.exprId().id() in padded
    return bool(expression.nullIntolerant()) and any(
        _null_where_padded(child, padded) for child in scala_items(expression.children()))
