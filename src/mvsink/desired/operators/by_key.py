"""Operators whose rows of one key depend only on their inputs' rows of that key: recomputed for
the keys a step's change touches, before and after.

* an aggregate grouped by expressions (``GROUP BY``, ``DISTINCT``): a group's row reads only the
  group's input rows, whatever its aggregates (``min``, ``max``, ``count(DISTINCT)``, ...);
* an outer, semi or anti join with at least one equality of the two sides (``=``, ``<=>``): a row of
  one side meets, or pads, or exists for, only the other side's rows of its key (a null key meets
  none: its rows are padded, or kept by an anti join, by themselves);
* a window partitioned by expressions, and the per-partition limit Spark puts under
  ``row_number() ... = 1`` (``WindowGroupLimit``, recomputed with the window above it): a
  partition's rows read only the partition;
* ``dropDuplicates`` by columns.

With ``K`` the keys of the input changes' rows (both sides', :class:`~.keys.TouchedKeys`) and
``Q|K`` the operator over its inputs' rows of those keys, ``Q' - Q = Q'|K - Q|K``: every other
key's rows are the same after as before. So the rows added are ``Q|K`` over the inputs after, the
rows removed ``Q|K`` over the inputs before; a key whose rows did not change is in both (they
cancel at the top). It holds nothing: each side's inputs are read where the keys lie.
"""

from __future__ import annotations

from mvsink.desired.operators.base import Change, Operator, Step
from mvsink.desired.operators.keys import TouchedKeys


class ByKey(Operator):
    words = "by key"

    def __init__(self, node, children: list[Operator], keys: list[list], below=None):
        super().__init__(node, children)
        #: Per child, the expressions of its rows' key (of one type and order for every child).
        self.keys = keys
        #: A node of one child between this one and its child, of the same key, recomputed with
        #: it (the ``WindowGroupLimit`` under a ``Window``: Spark pushes no filter through it).
        self.below = below

    def with_children(self, step: Step, children: list):
        if self.below is not None:
            children = [self.below.withNewChildren(step.catalyst.seq(children))]
        return super().with_children(step, children)

    def describe(self) -> str:
        if self.below is None:
            return super().describe()
        (child,) = self.children
        return f"{self.node.nodeName()} ({self.words})({self.below.nodeName()}({child.describe()}))"

    def _change(self, step: Step) -> Change:
        parts = []
        for child, exprs in zip(self.children, self.keys):
            change = child.change(step)
            if change is not None:
                parts += [(change.plus, exprs), (change.minus, exprs)]
        touched = TouchedKeys(step, parts)

        def recomputed(side: str):
            return self.with_children(step, [touched.restrict(child.value(step, side), exprs)
                                             for child, exprs in zip(self.children, self.keys)])

        return Change(recomputed("after"), recomputed("before"))
