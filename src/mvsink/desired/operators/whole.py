"""An operator recomputed whole: its value after, less its value before.

For what has no key that splits its rows (an aggregate without ``GROUP BY``, a window over
everything, a null-aware ``NOT IN``, a join without an equality): exact for any deterministic
operator, and as costly as evaluating its part of the query twice. The planner does not take a
query whose top is one, under row-wise nodes at most (full evaluation of the query, once per time, is cheaper).
"""

from __future__ import annotations

from mvsink.desired.operators.base import Change, Operator, Step


class Whole(Operator):
    words = "recomputed whole"

    def __init__(self, node, children: list[Operator], why: str):
        super().__init__(node, children)
        #: What it is, for a user: why it has no key.
        self.why = why

    def _change(self, step: Step) -> Change:
        return Change(self.value(step, "after"), self.value(step, "before"))
