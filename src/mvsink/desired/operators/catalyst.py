"""Catalyst plans built from Python: the few node and expression constructors the operators use.

The operators work on Spark's optimized logical plan of the query over held rows (one
``LogicalRDD`` leaf per source, :data:`~mvsink.desired.row_wise.HELD_ROWS`). A node is evaluated
over other inputs by giving it other children (``withNewChildren``): its expressions read its
children's attributes by id, so every plan put under a node must output the attributes of the
child it replaces, with their ids. A source's rows get them by :meth:`Catalyst.aliased`; every other plan
here is built from the node's own children and keeps them.

Invariant: nothing here runs a Spark job; :meth:`Catalyst.frame` makes a DataFrame (lazy) of a plan.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame, SparkSession

from mvsink.desired.row_wise import scala_items as items


class Catalyst:
    """Constructors of Catalyst's plans and expressions in one session's JVM."""

    def __init__(self, session: SparkSession):
        self.session = session
        jvm = session.sparkContext._jvm
        self._jvm = jvm
        self.expressions = jvm.org.apache.spark.sql.catalyst.expressions
        self.logical = jvm.org.apache.spark.sql.catalyst.plans.logical
        self._none = getattr(getattr(jvm.scala, "None$"), "MODULE$")
        self._types = jvm.org.apache.spark.sql.types
        self._join_types = jvm.org.apache.spark.sql.catalyst.plans
        self._nil = self.seq([])
        self._literals = getattr(getattr(self.expressions, "Literal$"), "MODULE$")
        self._string = getattr(getattr(self._types, "StringType$"), "MODULE$")
        trees = jvm.org.apache.spark.sql.catalyst.trees
        self.plan_expression = getattr(getattr(trees, "TreePattern$"), "MODULE$").PLAN_EXPRESSION()

    def seq(self, values: list):
        """A Scala ``Seq`` of JVM objects."""
        java = self._jvm.java.util.ArrayList()
        for value in values:
            java.add(value)
        return self._jvm.scala.jdk.javaapi.CollectionConverters.asScala(java).toSeq()

    def frame(self, plan) -> DataFrame:
        """A DataFrame of ``plan`` (analyzed again, and optimized, when it runs)."""
        jdf = self._jvm.org.apache.spark.sql.classic.Dataset.ofRows(self.session._jsparkSession, plan)
        return DataFrame(jdf, self.session)

    def analyzed(self, rows: DataFrame):
        """``rows``' analyzed logical plan."""
        return rows._jdf.queryExecution().analyzed()

    def alias(self, expression, name: str, like=None):
        """``expression AS name``, with the id of the attribute ``like`` (a new id if None)."""
        expr_id = like.exprId() if like is not None else self.expressions.NamedExpression.newExprId()
        return self.expressions.Alias(expression, name, expr_id, self._nil, self._none, self._nil)

    def project(self, expressions: list, child):
        return self.logical.Project(self.seq(expressions), child)

    def aliased(self, rows, leaf):
        """The plan ``rows`` (a source's rows, columns named as ``leaf``'s) outputting ``leaf``'s
        attributes, by name, with their ids."""
        by_name = {a.name(): a for a in items(rows.output())}
        return self.project([self.alias(by_name[a.name()], a.name(), a) for a in items(leaf.output())], rows)

    def empty(self, like):
        """No rows, with the attributes of the plan ``like``."""
        return self.logical.LocalRelation(like.output(), self._nil, False, self._none)

    def union(self, plans: list):
        """``UNION ALL`` of ``plans`` (of the same attributes: the first's are the result's)."""
        return plans[0] if len(plans) == 1 else self.logical.Union(self.seq(plans), False, False)

    def distinct(self, child):
        return self.logical.Distinct(child)

    def semi_join(self, left, right, condition):
        """``left``'s rows that some row of ``right`` meets by ``condition``."""
        semi = getattr(getattr(self._join_types, "LeftSemi$"), "MODULE$")
        hint = getattr(getattr(self.logical, "JoinHint$"), "MODULE$").NONE()
        return self.logical.Join(left, right, semi, self._jvm.scala.Some(condition), hint)

    def null_safe_equal(self, left, right):
        return self.expressions.EqualNullSafe(left, right)

    def all_of(self, conditions: list):
        return reduce(self.expressions.And, conditions)

    def filter(self, condition, child):
        return self.logical.Filter(condition, child)

    def nothing(self, child):
        """No row of ``child`` (its attributes)."""
        return self.logical.Filter(self._literals.FalseLiteral(), child)

    def within(self, expression, ranges: list[tuple], nulls: bool):
        """``expression`` within one of ``ranges`` (``(least, greatest)`` Python values, each given
        as text cast to the expression's type), ``OR expression IS NULL`` if ``nulls``; None for
        no range and no null."""
        data_type, e = expression.dataType(), self.expressions
        conditions = []
        for least, greatest in ranges:
            low = self._cast(self._literals.create(str(least), self._string), data_type)
            if least == greatest:
                conditions.append(e.EqualTo(expression, low))
            else:
                high = self._cast(self._literals.create(str(greatest), self._string), data_type)
                conditions.append(e.And(e.GreaterThanOrEqual(expression, low), e.LessThanOrEqual(expression, high)))
        if nulls:
            conditions.append(e.IsNull(expression))
        return self.any_of(conditions) if conditions else None

    def literal(self, value, data_type):
        """A constant of ``data_type`` (a Catalyst type) holding the Python ``value`` (as PySpark
        gives it back: None, int, Decimal, date, ...), by PySpark's own conversion."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import _parse_datatype_json_string

        typed = F.lit(value).cast(_parse_datatype_json_string(data_type.json()))
        return self.analyzed(self.session.range(1).select(typed.alias("value"))).projectList().head().child()

    def replaced(self, expression, by_id: dict):
        """``expression`` with each subquery whose ``exprId`` is a key of ``by_id`` replaced by its value."""
        if expression.nodeName() == "ScalarSubquery" and expression.exprId().id() in by_id:
            return by_id[expression.exprId().id()]
        if not expression.containsPattern(self.plan_expression):
            return expression
        return expression.withNewChildren(self.seq([self.replaced(c, by_id) for c in items(expression.children())]))

    def any_of(self, conditions: list):
        return reduce(self.expressions.Or, conditions)

    def _cast(self, expression, data_type):
        if data_type.typeName() == "string":
            return expression
        mode = getattr(getattr(self.expressions, "EvalMode$"), "MODULE$").LEGACY()
        return self.expressions.Cast(expression, data_type, self._jvm.scala.Some("UTC"), mode)

