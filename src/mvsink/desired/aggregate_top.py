"""An aggregate's *top*: expressions of its aggregates and ``HAVING``, split from the aggregates.

``SELECT k, sum(x) / sum(y) AS r FROM t GROUP BY k HAVING count(*) > 1`` is an aggregate whose
output columns are expressions of aggregate functions, under a filter (and projections). Its
optimized logical plan is row-wise nodes (``Project``, ``Filter``) over one ``Aggregate`` whose
output expressions may hold aggregate functions anywhere in them. Catalyst's own planner splits
such an ``Aggregate`` (``PhysicalAggregation``) into its grouping, its distinct aggregate
functions, and its result expressions over their results. Here that split gives two parts:

* the **core** (:func:`aggregate_core`): the ``Aggregate`` alone, with the grouping columns and one
  column per aggregate function (``_mv_aggregate_<i>``), so that a plain aggregate's strategy
  (:mod:`mvsink.desired.linear_aggregate`) can keep its state;
* the **top** (:class:`RowWiseTop`): the result expressions and the nodes above, a row-wise query
  over the core's rows, applied to any rows with the core's columns (the core's rows a step
  retracts and adds), other columns (a diff) passed through.

Invariant: the top over the core's rows is the query's result, row for row: the top is the query's
own plan above its ``Aggregate``, given the core's rows under the core's attributes (its
expressions refer to them by id). Being row-wise, it distributes over a multiset of rows with
diffs: the top of the rows retracted and added is the query's change, up to rows that cancel
(consolidated after).
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame

from mvsink.desired.row_wise import ROW_WISE_NODES, scala_items, under_row_wise

#: The core's column of the i-th aggregate function.
AGGREGATE_COLUMN = "_mv_aggregate_{}"


def aggregate_core(result: DataFrame) -> DataFrame | None:
    """``result``'s ``Aggregate`` alone (its grouping columns, then one column per distinct
    aggregate function) where its optimized plan is row-wise nodes over one ``Aggregate``, every
    expression deterministic and no subquery; else None."""
    split = _split(result)
    return _core(result, split) if split is not None else None


def aggregate_groups(result: DataFrame) -> DataFrame | None:
    """The distinct values of the grouping columns of ``result``'s ``Aggregate`` (under row-wise
    nodes, as :func:`aggregate_core` takes it) over its input: the groups that input has rows in,
    whatever the aggregates and the top do with them; None where it is not that shape."""
    split = _split(result)
    if split is None:
        return None
    jvm, aggregate, (groups, _, _, child) = split
    nodes = Catalyst(jvm)
    return nodes.frame(result, nodes.logical.Aggregate(groups, groups, child, aggregate.hint()))


def _core(result: DataFrame, split) -> DataFrame:
    """:func:`aggregate_core` of ``result``, from its :func:`_split`."""
    jvm, aggregate, (groups, functions, _, child) = split
    nodes = Catalyst(jvm)
    named = [nodes.alias(function, AGGREGATE_COLUMN.format(i), function.resultId())
             for i, function in enumerate(scala_items(functions))]
    core = jvm.org.apache.spark.sql.catalyst.plans.logical.Aggregate(
        groups, nodes.seq([*scala_items(groups), *named]), child, aggregate.hint())
    return nodes.frame(result, core)


class RowWiseTop:
    """The top of a query (see the module doc): applied by :meth:`over`."""

    def __init__(self, result: DataFrame):
        """The top of ``result``, whose :func:`aggregate_core` is not None."""
        split = _split(result)
        jvm, _, (groups, _, results, _) = split
        self._nodes = Catalyst(jvm)
        self._group_ids = {g.exprId().id() for g in scala_items(groups)}
        #: ``result``'s :func:`aggregate_core`.
        self.core = _core(result, split)
        #: The core's output attributes, which the result expressions and the nodes above refer to.
        self._core = scala_items(self.core._jdf.queryExecution().analyzed().output())
        self._results = scala_items(results)
        plan, self._above = result._jdf.queryExecution().optimizedPlan(), []
        #: The query's columns, by name: their attributes' ids.
        self._output = {a.name(): a.exprId().id() for a in scala_items(plan.output())}
        while plan.nodeName() in ROW_WISE_NODES:
            self._above.append(plan)
            plan = plan.children().head()

    def groups_are_keyed(self, key: tuple[str, ...]) -> bool:
        """Whether ``key`` (columns of the query) holds every grouping column, passed on as it is
        (selected or renamed): then the query has at most one row per key value, whatever the
        rows (each group has one row at most)."""
        ids = [self._output[name] for name in key if name in self._output]
        for named in [*(scala_items(n.projectList()) for n in self._above if n.nodeName() == "Project"),
                      self._results]:
            ids = _passed_ids(named, ids)
        return self._group_ids <= set(ids)

    def over(self, rows: DataFrame) -> DataFrame:
        """The top over ``rows``: each has the core's columns (by name) and maybe others, which
        each output row has as its input row had them, after the query's columns."""
        nodes, logical = self._nodes, self._nodes.logical
        plan = rows._jdf.queryExecution().analyzed()
        by_name = {a.name(): a for a in scala_items(plan.output())}
        core_names = {a.name() for a in self._core}
        passed = [a for name, a in by_name.items() if name not in core_names]
        plan = logical.Project(nodes.seq([*(nodes.alias(by_name[a.name()], a.name(), a.exprId()) for a in self._core),
                                          *passed]), plan)
        plan = logical.Project(nodes.seq([*self._results, *passed]), plan)
        for node in reversed(self._above):
            plan = (logical.Filter(node.condition(), plan) if node.nodeName() == "Filter"
                    else logical.Project(nodes.seq([*scala_items(node.projectList()), *passed]), plan))
        return nodes.frame(rows, plan)


def _passed_ids(named: list, ids: list[int]) -> list[int]:
    """Of the attributes of ``ids`` that the expressions ``named`` (a projection) output, the ids
    of the input attributes they are (as they are, or renamed); the computed ones left out."""
    passed = []
    for expression in named:
        if expression.exprId().id() in ids:
            source = expression.child() if expression.nodeName() == "Alias" else expression
            if source.nodeName() == "AttributeReference":
                passed.append(source.exprId().id())
    return passed


def _split(result: DataFrame):
    """``(jvm, the Aggregate, PhysicalAggregation's (grouping, aggregate functions, result
    expressions, child))`` of ``result``'s plan, if it has the shape :func:`aggregate_core` takes."""
    node = under_row_wise(result)
    if node is None or node.nodeName() != "Aggregate":
        return None
    jvm = result.sparkSession.sparkContext._jvm
    physical = getattr(getattr(jvm.org.apache.spark.sql.catalyst.planning, "PhysicalAggregation$"), "MODULE$")
    split = physical.unapply(node)
    if split.isEmpty():
        return None
    groups, functions, results, child = (split.get()._1(), split.get()._2(), split.get()._3(), split.get()._4())
    if any(g.nodeName() != "AttributeReference" for g in scala_items(groups)):  # a computed grouping: not taken
        return None
    return jvm, node, (groups, functions, results, child)


class Catalyst:
    """Catalyst's nodes and Scala's values, built through the JVM."""

    def __init__(self, jvm):
        self._jvm = jvm
        self.logical = jvm.org.apache.spark.sql.catalyst.plans.logical
        self._nil = getattr(getattr(jvm.scala.collection.immutable, "Nil$"), "MODULE$")
        self._none = getattr(getattr(jvm.scala, "None$"), "MODULE$")

    def seq(self, items: list):
        """A Scala ``List`` of ``items``."""
        seq = self._nil
        for item in reversed(items):
            seq = seq.prepended(item)
        return seq

    def alias(self, expression, name: str, expr_id):
        """``expression AS name``, as the attribute of id ``expr_id``."""
        return self._jvm.org.apache.spark.sql.catalyst.expressions.Alias(
            expression, name, expr_id, self._nil, self._none, self._nil)

    def and_(self, left, right):
        """``left AND right``."""
        return self._jvm.org.apache.spark.sql.catalyst.expressions.And(left, right)

    def is_not_null(self, expression):
        """``expression IS NOT NULL``."""
        return self._jvm.org.apache.spark.sql.catalyst.expressions.IsNotNull(expression)

    def new_expr_id(self):
        """An attribute id no plan has yet."""
        return getattr(getattr(self._jvm.org.apache.spark.sql.catalyst.expressions, "NamedExpression$"),
                       "MODULE$").newExprId()

    def join_type(self, name: str):
        """Catalyst's join type of ``name`` (``Inner``, ``LeftSemi``, ...)."""
        return getattr(getattr(self._jvm.org.apache.spark.sql.catalyst.plans, f"{name}$"), "MODULE$")

    def rejoined(self, plan, new_type: Callable):
        """``plan`` with each join made the type ``new_type(join)`` names (None: as it is), the
        same condition and hint, rebuilt from the changed joins up (``new_type`` sees a join with
        its children already rebuilt); None where no join changes."""
        children = scala_items(plan.children())
        below = [self.rejoined(child, new_type) for child in children]
        made = None
        if any(new is not None for new in below):
            made = plan = plan.withNewChildren(
                self.seq([old if new is None else new for new, old in zip(below, children)]))
        kind = new_type(plan) if plan.nodeName() == "Join" else None
        if kind is not None:
            made = self.logical.Join(plan.left(), plan.right(), self.join_type(kind), plan.condition(), plan.hint())
        return made

    def frame(self, like: DataFrame, plan) -> DataFrame:
        """The DataFrame of the logical ``plan``, in ``like``'s session."""
        spark = like.sparkSession
        return DataFrame(self._jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, plan), spark)
