"""``UNION ALL``: its change is its branches' changes, side by side.

A branch none of whose sources moved adds no rows to either side (an empty relation of its
attributes keeps the union's shape: the first branch's attributes are the union's).
"""

from __future__ import annotations

from mvsink.desired.operators.base import Change, Operator, Step


class UnionAll(Operator):
    def _change(self, step: Step) -> Change:
        changes = [(child, child.change(step)) for child in self.children]
        empty = step.catalyst.empty
        return Change(self.with_children(step, [c.plus if c else empty(child.node) for child, c in changes]),
                      self.with_children(step, [c.minus if c else empty(child.node) for child, c in changes]))
