"""An inner (or cross) join: the delta rule of a product.

With ``L`` and ``R`` its inputs before a step and ``L'``, ``R'`` after, ``dL = L' - L``:

    ``L' ⋈ R' - L ⋈ R = dL ⋈ R + L' ⋈ dR``

so the rows added are ``L.plus ⋈ R + L' ⋈ R.plus`` and the rows removed ``L.minus ⋈ R + L' ⋈
R.minus`` (a side that did not move has no term). The other side of each term is its value at
that side's versions; where the change is small, it is read only where its join keys meet the
change's (:meth:`~.keys.TouchedKeys.prune`: Delta skips the files that cannot hold them). It
holds nothing.
"""

from __future__ import annotations

from mvsink.desired.operators.base import Change, Operator, Step
from mvsink.desired.operators.keys import TouchedKeys, equi_keys


class InnerJoin(Operator):
    words = "delta rule"

    def __init__(self, node, children: list[Operator]):
        super().__init__(node, children)
        #: The join's equalities as each side's expressions (empty lists: none, a cross join).
        self.keys = equi_keys(node)

    def _change(self, step: Step) -> Change:
        left, right = self.children
        left_keys, right_keys = self.keys
        plus, minus = [], []
        moved = left.change(step)
        if moved is not None:
            other = TouchedKeys.pruned(step, right.value(step, "before"), right_keys,
                                       [(moved.plus, left_keys), (moved.minus, left_keys)])
            plus.append(self.with_children(step, [moved.plus, other]))
            minus.append(self.with_children(step, [moved.minus, other]))
        moved = right.change(step)
        if moved is not None:
            other = TouchedKeys.pruned(step, left.value(step, "after"), left_keys,
                                       [(moved.plus, right_keys), (moved.minus, right_keys)])
            plus.append(self.with_children(step, [other, moved.plus]))
            minus.append(self.with_children(step, [other, moved.minus]))
        return Change(step.catalyst.union(plus), step.catalyst.union(minus))
