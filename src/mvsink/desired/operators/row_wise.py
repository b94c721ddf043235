"""Operators that map each input row to rows of its own: projections, filters, ``Expand``
(grouping sets, distinct aggregates), generators, sorts and repartitions.

Such an operator ``Q`` distributes over multiset sums, so its change is the operator applied to
its input's change: ``Q(plus)`` added, ``Q(minus)`` removed. It holds nothing. (Its expressions are
deterministic and read no subquery: the planner refuses the rest.)
"""

from __future__ import annotations

from mvsink.desired.operators.base import Change, Operator, Step


class RowWise(Operator):
    def _change(self, step: Step) -> Change:
        (child,) = self.children
        change = child.change(step)
        return Change(self.with_children(step, [change.plus]), self.with_children(step, [change.minus]))
