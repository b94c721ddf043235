"""The planner: a query's optimized plan as a tree of operators, each node's delta rule chosen by
what the node is, or the node that none maintains.

The plan is Spark's, optimized for the query over held rows (one ``LogicalRDD`` per source, named
by :func:`~mvsink.desired.join.held_names`). Each node gets the rule of its kind:

=======================================================  =========================================
node                                                     rule
=======================================================  =========================================
a source's held rows; ``VALUES``, ``range``              :mod:`.source`
``Project``, ``Filter``, ``Expand``, ``Generate``,       :mod:`.row_wise`
``Sort``, repartitions
``Filter``, ``Project`` reading scalar subqueries        :mod:`.scalars`
``Union`` (``UNION ALL``)                                :mod:`.union`
inner and cross ``Join``                                 :mod:`.inner_join`
``Aggregate`` of ``count``, ``sum``, ``avg`` (exact)     :mod:`.linear`
``Aggregate`` with ``GROUP BY``; outer, semi and anti    :mod:`.by_key`
``Join`` with an equality; ``Window``,
``WindowGroupLimit`` partitioned; ``Deduplicate``
the same without a key (a null-aware ``NOT IN``,         :mod:`.whole`
``EXISTS`` under ``OR``, an aggregate of everything)
=======================================================  =========================================

Refused (:class:`NotMaintained`, naming what): a non-deterministic expression, a subquery Spark
left in an expression other than an uncorrelated scalar one of a filter or projection, a limit or
sample, an aggregate whose value depends on its rows' order (``first``, ``collect_list``: Spark
calls them deterministic), any other node, rows not of a source, and a plan whose top is
recomputed whole (under row-wise nodes at most: evaluating the query in full costs less).
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from mvsink.desired.join import held_names
from mvsink.desired.linear_aggregate import aggregate_shape
from mvsink.desired.operators.base import Operator
from mvsink.desired.operators.by_key import ByKey
from mvsink.desired.operators.inner_join import InnerJoin
from mvsink.desired.operators.catalyst import Catalyst
from mvsink.desired.operators.keys import equi_keys
from mvsink.desired.operators.linear import HeldAggregate
from mvsink.desired.operators.row_wise import RowWise
from mvsink.desired.operators.scalars import OverScalars, Scalar
from mvsink.desired.operators.source import Constant, Source
from mvsink.desired.operators.union import UnionAll
from mvsink.desired.operators.whole import Whole
from mvsink.desired.row_wise import HELD_ROWS, RUNTIME_FILTERS, conjuncts, scala_items

ROW_WISE = frozenset({"Project", "Filter", "Expand", "Generate", "Sort", "RepartitionByExpression",
                      "Repartition", "RebalancePartitions"})
CONSTANT = frozenset({"LocalRelation", "OneRowRelation", "Range"})
KEYED_JOINS = frozenset({"LeftOuter", "RightOuter", "FullOuter", "LeftSemi", "LeftAnti"})
#: Nodes of one input recomputed by key, and their key expressions.
KEYED = {"Aggregate": lambda node: node.groupingExpressions(), "Window": lambda node: node.partitionSpec(),
         "WindowGroupLimit": lambda node: node.partitionSpec(), "Deduplicate": lambda node: node.keys()}
LIMITS = frozenset({"GlobalLimit", "LocalLimit", "Tail", "Offset", "Sample"})
#: Aggregate functions whose value depends on the order of the group's rows (Spark calls them
#: deterministic): a group recomputed would differ from the query evaluated again.
ORDER_DEPENDENT = frozenset({"First", "Last", "AnyValue", "CollectList", "CollectSet"})


class NotMaintained(Exception):
    """The plan has a part no operator maintains (the message says which)."""


def operators(query_over_held: DataFrame, held: dict[str, DataFrame]) -> Operator:
    """The operator tree of the query's plan over ``held`` rows (by source name); raises
    :class:`NotMaintained`."""
    plan = query_over_held._jdf.queryExecution().optimizedPlan()
    if not plan.deterministic():
        raise NotMaintained("a non-deterministic expression")
    root = _operator(plan, held_names(held), Catalyst(query_over_held.sparkSession))
    top = root
    while isinstance(top, RowWise) and not isinstance(top, OverScalars):
        (top,) = top.children
    if isinstance(top, Whole):
        raise NotMaintained(f"{top.why} at its top, which would be recomputed whole")
    return root


def _operator(node, names: dict[int, str], catalyst: Catalyst) -> Operator:
    """The operator of ``node`` over its children's (a node's refusal named before its children's)."""
    name = node.nodeName()
    scalars = [Scalar(e, _operator(e.plan(), names, catalyst)) for e in _subqueries(node, catalyst.plan_expression)]
    if scalars and name not in ("Filter", "Project"):
        raise NotMaintained(f"a subquery in an expression of {_a(name)}")
    if name in LIMITS:
        raise NotMaintained(f"{_a(name)} (its rows depend on the order of all rows)")
    if name not in ROW_WISE | CONSTANT | KEYED.keys() | {HELD_ROWS, "Union", "Join"}:
        raise NotMaintained(_a(name))
    if name == "Aggregate":
        found = _order_dependent(node.aggregateExpressions())
        if found is not None:
            raise NotMaintained(f"an aggregate whose value depends on the order of its rows ({found})")
    if name == "Window" and node.child().nodeName() == "WindowGroupLimit" and _same_keys(node, node.child()):
        exprs = scala_items(node.partitionSpec())
        return ByKey(node, [_operator(node.child().child(), names, catalyst)], [exprs], below=node.child())
    children = [_operator(child, names, catalyst) for child in scala_items(node.children())]
    if name == HELD_ROWS:
        source = names.get(node.rdd().id())
        if source is None:
            raise NotMaintained("rows that are not a source's")
        return Source(node, source)
    if name in CONSTANT:
        return Constant(node, children)
    if scalars:
        return OverScalars(node, children, scalars)
    if name in ROW_WISE:
        return RowWise(node, children)
    if name == "Union":
        return UnionAll(node, children)
    if name == "Join":
        join_type = node.joinType().toString()
        if join_type in ("Inner", "Cross"):
            return InnerJoin(node, children)
        left, right = equi_keys(node)
        if left and join_type in KEYED_JOINS:
            return ByKey(node, children, [left, right])
        return Whole(node, children, f"{_a(join_type)} Join with no key (no equality of its sides)")
    if name == "Aggregate":
        rows = catalyst.frame(node)
        shape = aggregate_shape(rows)
        if shape is not None and len(set(rows.columns)) == len(rows.columns):
            return HeldAggregate(node, children, shape, rows.schema)
    exprs = scala_items(KEYED[name](node))
    return ByKey(node, children, [exprs]) if exprs else Whole(node, children, f"{_a(name)} with no key (of everything)")


def _subqueries(node, subquery) -> list:
    """The uncorrelated scalar subqueries of ``node``'s expressions, outermost first (not those of a
    filter the optimizer added, :data:`~mvsink.desired.row_wise.RUNTIME_FILTERS`); raises
    :class:`NotMaintained` for any other subquery."""
    expressions = (conjuncts(node.condition()) if node.nodeName() == "Filter" else scala_items(node.expressions()))
    pending = [e for e in expressions if e.nodeName() not in RUNTIME_FILTERS and e.containsPattern(subquery)]
    found = []
    while pending:
        expression = pending.pop(0)
        if expression.nodeName() == "ScalarSubquery":
            if not expression.outerAttrs().isEmpty():
                raise NotMaintained("a correlated subquery Spark does not rewrite into a join")
            found.append(expression)
        elif expression.nodeName() in ("Exists", "InSubquery", "ListQuery", "LateralSubquery"):
            raise NotMaintained(f"{_a(expression.nodeName())} subquery Spark does not rewrite into a join")
        else:
            pending += [c for c in scala_items(expression.children()) if c.containsPattern(subquery)]
    return found


def _order_dependent(expressions) -> str | None:
    """The first of :data:`ORDER_DEPENDENT` among ``expressions`` (a Scala ``Seq``), by name; else None."""
    pending = scala_items(expressions)
    while pending:
        expression = pending.pop()
        if expression.nodeName() in ORDER_DEPENDENT:
            return expression.prettyName()
        pending += scala_items(expression.children())
    return None


def _same_keys(window, limit) -> bool:
    """Whether a window and the limit under it are partitioned by the same expressions."""
    keys = [scala_items(node.partitionSpec()) for node in (window, limit)]
    return len(keys[0]) == len(keys[1]) > 0 and all(a.semanticEquals(b) for a, b in zip(*keys))


def _a(name: str) -> str:
    """``name`` after its article: ``an Aggregate``, ``a LeftOuter``."""
    return f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"
