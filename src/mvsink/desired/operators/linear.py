"""A linear aggregate with its groups' state held: ``count``, ``sum`` and ``avg`` of integers and
decimals, grouped by columns or not (:mod:`mvsink.desired.linear_aggregate` says which, and how
the state adds up).

Its state is, per group, the row count and each aggregate's sum and count of non-null values: a
function of its sources' versions, held (one Spark job) and known by them. The state after a step
is the state before plus its input's change aggregated (rows added at +1, removed at -1), in one
grouping of both (one job): the groups the change touches move, and their output rows before
and after are the operator's change. Its value on either side is its state's output rows, no
input read. The state before the first step (or one whose versions are not held: another
replica's range, a step evaluated in full) is its input's value aggregated, once.

Against the by-key rule (:mod:`.by_key`), which recomputes the touched groups from the input
before and after: a few groups touched by every change (TPC-H Q22's seven country codes) cost
the change, not the input twice. The state is the aggregate's size; at most :data:`_KEPT` states
are held.
"""

from __future__ import annotations

from time import monotonic

from pyspark.sql import functions as F

from mvsink.desired.linear_aggregate import GroupStates, LinearAggregate
from mvsink.desired.operators.base import Change, Operator, Step
from mvsink.updates import DIFF

#: How many states (by versions) are held: the one before a step, the one after, one more.
_KEPT = 3


class HeldAggregate(Operator):
    words = "groups held"

    def __init__(self, node, children: list[Operator], shape: LinearAggregate, schema):
        super().__init__(node, children)
        self.shape = shape
        self.groups = GroupStates(shape, schema, ())
        self._states: dict[tuple, object] = {}

    def _value(self, step: Step, side: str):
        return self._rows(step, self.groups.output(self._state(step, side)))

    def _change(self, step: Step) -> Change:
        updates = self.groups.updates(self._moved(step))
        return Change(self._rows(step, updates.where(F.col(DIFF) > 0).drop(DIFF)),
                      self._rows(step, updates.where(F.col(DIFF) < 0).drop(DIFF)))

    def _state(self, step: Step, side: str):
        """The state at ``side``'s versions: held, or the state before moved by the step (where
        its sources moved), or the input's value aggregated."""
        at = self._at(step, side)
        if at not in self._states:
            if side == "after" and at != self._at(step, "before"):
                self._moved(step)
            else:
                (child,) = self.children
                started = monotonic()
                self._hold(at, self.groups.state(self._input(step, child.value(step, side))).localCheckpoint(eager=True))
                step.setup[0] += monotonic() - started
        return self._states[at]

    def _moved(self, step: Step):
        """The state before with the step's change, per group (:meth:`GroupStates.next_state`),
        held; its groups that keep rows are the state after."""
        key = (id(self), "moved")
        if key not in step.built:
            (child,) = self.children
            change = child.change(step)
            before = self._state(step, "before")
            changed = self.groups.rows_as_state(self._input(step, change.plus), 1).unionByName(
                self.groups.rows_as_state(self._input(step, change.minus), -1))
            moved = self.groups.next_state(before, changed).localCheckpoint(eager=True)
            self._hold(self._at(step, "after"), self.groups.kept_state(moved))
            step.built[key] = moved
        return step.built[key]

    def _input(self, step: Step, rows):
        """The aggregate's input rows (its arguments computed) of ``rows``, a plan of its child's."""
        return self.shape.aggregate_input(step.catalyst.frame(self.with_children(step, [rows])))

    def _rows(self, step: Step, rows):
        """``rows`` (of the node's output columns, by name) as a plan of the node's attributes."""
        catalyst = step.catalyst
        return catalyst.aliased(catalyst.analyzed(rows), self.node)

    def _at(self, step: Step, side: str) -> tuple:
        versions = step.versions(side)
        return tuple(sorted((name, versions[name]) for name in self.sources))

    def _hold(self, at: tuple, state) -> None:
        self._states[at] = state
        for old in list(self._states)[:-_KEPT]:
            del self._states[old]
