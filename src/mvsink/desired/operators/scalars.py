"""A filter or projection that reads uncorrelated scalar subqueries: TPC-H Q11's ``HAVING sum(..)
> (SELECT sum(..) * 0.0001 ...)``, Q15's ``= (SELECT max(total_revenue) ...)``, Q22's ``c_acctbal >
(SELECT avg(c_acctbal) ...)``. (Spark rewrites a correlated one into a join with an aggregate,
which the other rules maintain.)

Each subquery's plan is an operator tree of its own. Its value at a side is one row of one
column (null where it has no row), found by one Spark job and known after that by the versions of
its sources: the value after one step is the value before the next, so a step evaluates each
subquery once, and not at all while its sources do not move. With those values as literals the
node is row-wise (and its literals reach the scans' data skipping like any constant). Its change:

* every subquery's value the same before and after: the node over its input's change, as
  :mod:`.row_wise` (nothing where the input has none);
* one moved: any row of the input may pass or fail, or map elsewhere: the node's value after
  less its value before, as :mod:`.whole`.
"""

from __future__ import annotations

from mvsink.desired.operators.base import Change, Operator, Step
from mvsink.desired.operators.row_wise import RowWise
from mvsink.desired.row_wise import scala_items

#: How many of each subquery's values are kept, by its sources' versions (a step reads two).
_KEPT_VALUES = 4


class Scalar:
    """One scalar subquery of a node: its expression, its plan's operators, its values so far."""

    def __init__(self, expression, operator: Operator):
        self.expression = expression
        self.operator = operator
        self._values: dict[tuple, object] = {}

    def value(self, step: Step, side: str):
        """Its value at ``side`` as a Python value (one Spark job the first time its sources are
        at these versions)."""
        versions = step.versions(side)
        at = tuple(sorted((name, versions[name]) for name in self.operator.sources))
        if at not in self._values:
            rows = step.catalyst.frame(self.operator.value(step, side)).limit(2).collect()
            if len(rows) > 1:
                raise ValueError(f"a scalar subquery returned more than one row: {self.expression.sql()}")
            self._values[at] = rows[0][0] if rows else None
            for old in list(self._values)[:-_KEPT_VALUES]:
                del self._values[old]
        return self._values[at]


class OverScalars(RowWise):
    """A ``Filter`` or ``Project`` whose expressions read :class:`Scalar` subqueries."""

    def __init__(self, node, children: list[Operator], scalars: list[Scalar]):
        super().__init__(node, children)
        self.scalars = scalars
        self.sources = self.sources.union(*(s.operator.sources for s in scalars))
        kept = "its scalar subqueries keep their values" if len(scalars) > 1 else "its scalar subquery keeps its value"
        self.words = f"row-wise while {kept}: " + ", ".join(s.operator.describe() for s in scalars)

    def _value(self, step: Step, side: str):
        (child,) = self.children
        return self._with_values(step, side, child.value(step, side))

    def _change(self, step: Step) -> Change:
        (child,) = self.children
        if any(s.value(step, "before") != s.value(step, "after") for s in self.scalars):
            return Change(self.value(step, "after"), self.value(step, "before"))
        change = child.change(step)
        if change is None:
            nothing = step.catalyst.empty(self.node)
            return Change(nothing, nothing)
        return Change(self._with_values(step, "after", change.plus), self._with_values(step, "after", change.minus))

    def _with_values(self, step: Step, side: str, child):
        """The node over ``child``, each subquery replaced by its value at ``side``."""
        catalyst = step.catalyst
        literals = {s.expression.exprId().id(): catalyst.literal(s.value(step, side), s.expression.dataType())
                    for s in self.scalars}
        if self.node.nodeName() == "Filter":
            return catalyst.filter(catalyst.replaced(self.node.condition(), literals), child)
        return catalyst.project([catalyst.replaced(e, literals) for e in scala_items(self.node.projectList())], child)
