"""Whether a snapshot view's query is *row-wise*: its result is each source row mapped on its own.

A query is row-wise when its optimized logical plan is projections and filters (``Project``,
``Filter``) over one scan of a Delta table, every expression deterministic, and no subquery
anywhere (a scalar subquery reads the whole source, so a row's output would depend on others).
Such a query ``Q`` maps a multiset of rows row by row, so it distributes over multiset sums:
``Q(S + inserted - deleted) = Q(S) + Q(inserted) - Q(deleted)``. The view's changes between two
source versions are then ``Q`` applied to the source's change data feed, inserted rows at +1 and
deleted rows at -1: the work follows the change, and no earlier result needs to be kept.

Anything else (aggregates, joins, distinct, limits, windows, Python UDFs, generators, ``rand()``)
is not row-wise and is recomputed in full at each time (:class:`mvsink.desired.snapshot.SnapshotDesired`).
"""

from __future__ import annotations

from pyspark.sql import DataFrame

#: Plan nodes that map one input row to at most one output row, on its own.
ROW_WISE_NODES = frozenset({"Project", "Filter"})
#: The plan node of a scan of a Delta table, and of rows held in Spark (a local checkpoint).
TABLE_SCAN, HELD_ROWS = "LogicalRelation", "LogicalRDD"


def is_row_wise(result: DataFrame, scan: str) -> bool:
    """Whether ``result`` is row-wise (see the module doc) over one leaf, a ``scan`` node: the
    query over a source (:data:`TABLE_SCAN`), or over rows held in Spark (:data:`HELD_ROWS`),
    which shows that the query read the rows it was given and nothing else."""
    plan = result._jdf.queryExecution().optimizedPlan()
    return plan.deterministic() and not plan_reads_subqueries(result, plan) and plan_is_row_wise(plan, scan)


def plan_is_row_wise(plan, scan: str) -> bool:
    """Whether the logical ``plan`` is row-wise nodes over one ``scan`` leaf (determinism and
    subqueries aside)."""
    node = plan
    while node.nodeName() in ROW_WISE_NODES:
        node = node.children().head()
    return node.nodeName() == scan and node.children().isEmpty()


def under_row_wise(result: DataFrame):
    """The first node of ``result``'s optimized logical plan that is not row-wise (the plan
    itself, or under its projections and filters), where every expression of the plan is
    deterministic and none reads a subquery; else None."""
    plan = result._jdf.queryExecution().optimizedPlan()
    if not plan.deterministic() or plan_reads_subqueries(result, plan):
        return None
    node = plan
    while node.nodeName() in ROW_WISE_NODES:
        node = node.children().head()
    return node


def passed_through(result: DataFrame, columns: tuple[str, ...]) -> tuple[str, ...] | None:
    """For a row-wise ``result``: the names of its leaf's columns that its ``columns`` are, value
    for value (selected as they are, or renamed); None if one of them is computed."""
    plan = result._jdf.queryExecution().optimizedPlan()
    output = {a.name(): a.exprId().id() for a in scala_items(plan.output())}
    if any(c not in output for c in columns):
        return None
    return leaf_columns(plan, [output[c] for c in columns])


def leaf_columns(plan, ids: list[int]) -> tuple[str, ...] | None:
    """For a row-wise logical ``plan``: the names of its leaf's columns that its output
    attributes of ``ids`` are, value for value; None if one of them is computed."""
    node = plan
    while node.nodeName() in ROW_WISE_NODES:
        if node.nodeName() == "Project":  # a filter passes its input's columns on as they are
            named = {e.exprId().id(): e for e in scala_items(node.projectList())}
            sources = [named.get(i) for i in ids]
            sources = [e.child() if e is not None and e.nodeName() == "Alias" else e for e in sources]
            if any(e is None or e.nodeName() != "AttributeReference" for e in sources):
                return None
            ids = [e.exprId().id() for e in sources]
        node = node.children().head()
    leaf = {a.exprId().id(): a.name() for a in scala_items(node.output())}
    return tuple(leaf[i] for i in ids) if all(i in leaf for i in ids) else None


def scala_items(seq) -> list:
    """A Scala ``Seq``'s items (of a plan read through the JVM)."""
    return [seq.apply(i) for i in range(seq.size())]


def plan_leaves(plan) -> list:
    """The leaves under the logical ``plan``."""
    children = scala_items(plan.children())
    return [plan] if not children else [leaf for child in children for leaf in plan_leaves(child)]


def references(expression) -> set[int]:
    """The ids of the attributes ``expression`` (Catalyst's) reads."""
    return {a.exprId().id() for a in scala_items(expression.references().toSeq())}


def conjuncts(expression) -> list:
    """The conjuncts of a condition (``a AND b AND ...``)."""
    if expression.nodeName() == "And":
        return conjuncts(expression.left()) + conjuncts(expression.right())
    return [expression]


#: Filters Spark's optimizer adds to a join's side from the other side's rows (a runtime bloom
#: filter, dynamic partition pruning): they hold a subquery, but only drop rows the join drops,
#: as the query reads them the same with or without (their subquery is not the query's).
RUNTIME_FILTERS = frozenset({"BloomFilterMightContain", "DynamicPruningSubquery"})


def plan_reads_subqueries(result: DataFrame, plan) -> bool:
    """Whether some expression of the logical ``plan`` (of ``result``) holds a plan: a subquery,
    not one of a filter the optimizer added (:data:`RUNTIME_FILTERS`: it adds them where a side's
    scan is large, or its size unknown, as a table with deletion vectors is, so the plans of one
    query over the sources and over a step's rows differ by them)."""
    pattern = _plan_expression_pattern(result)
    if not plan.containsPattern(pattern):
        return False

    def reads(node) -> bool:
        expressions = (conjuncts(node.condition()) if node.nodeName() == "Filter"
                       else scala_items(node.expressions()))
        return (any(e.nodeName() not in RUNTIME_FILTERS and e.containsPattern(pattern) for e in expressions)
                or any(reads(child) for child in scala_items(node.children())))
    return reads(plan)


def _plan_expression_pattern(result: DataFrame):
    """Catalyst's tree pattern of an expression holding a plan (any subquery)."""
    trees = result.sparkSession.sparkContext._jvm.org.apache.spark.sql.catalyst.trees
    return getattr(getattr(trees, "TreePattern$"), "MODULE$").PLAN_EXPRESSION()
