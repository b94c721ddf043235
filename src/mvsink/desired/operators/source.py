"""The leaves: a source read by the query, and rows that are the same at every version.

A source's value at a side is its rows at that side's version; its change is the rows its
commits between the two versions added (``plus``) and removed (``minus``), as
:func:`~mvsink.desired.change_feed.source_changes` reads them (from the log's files, or the
change data feed). Either is given the leaf's attributes (:meth:`~.catalyst.Catalyst.aliased`).
"""

from __future__ import annotations

from mvsink.desired.operators.base import Change, Operator, Step


class Source(Operator):
    """A read of source ``name`` (one held leaf; a source read twice is two names)."""

    def __init__(self, node, name: str):
        super().__init__(node, [])
        self.name = name
        self.sources = frozenset({name})

    def _value(self, step: Step, side: str):
        rows = step.read(self.name, step.versions(side)[self.name])
        return step.catalyst.aliased(step.catalyst.analyzed(rows), self.node)

    def _change(self, step: Step) -> Change:
        plus, minus = step.source_change(self.name)
        catalyst = step.catalyst
        return Change(catalyst.aliased(catalyst.analyzed(plus), self.node),
                      catalyst.aliased(catalyst.analyzed(minus), self.node))

    def describe(self) -> str:
        return self.name


class Constant(Operator):
    """Rows of the query's own (``VALUES``, ``range``): the same at every version, no change."""

    def _value(self, step: Step, side: str):
        return self.node
