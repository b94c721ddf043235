"""An operator of a query's plan, its value at a step's versions and its change between them.

A query's optimized plan is a tree of Catalyst nodes over its sources; each node becomes one
:class:`Operator` whose class is the node's *delta rule* (:mod:`.plan` picks it). At a step from
the versions before to the versions after (one time of the timeline), every operator has

* a **value** on each side (:meth:`Operator.value`): its node over its children's values, the
  sources read at that side's versions: what the query's part computes there;
* a **change** (:meth:`Operator.change`): a :class:`Change`, two multisets of rows, ``plus`` and
  ``minus``, with ``value(after) = value(before) + plus - minus``. A row may be in both (the two
  are consolidated at the top only); an operator none of whose sources moved has no change (None).

Each rule computes its change from its children's changes and values, so any tree of rules is
maintained: the rules compose, none knows the shape above or below it.

Invariants: every plan an operator returns outputs its node's attributes (by id), so its
parent's expressions read it as they read the node; values and changes are plans (lazy), built
once per step and operator (:class:`Step` keeps them), and only :mod:`.keys` (the keys a change
touches, held) and :mod:`.scalars` (a scalar subquery's value) run Spark jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from mvsink.desired.operators.catalyst import Catalyst


@dataclass(frozen=True)
class Change:
    """An operator's change at a step: rows added (``plus``) and rows removed (``minus``), each a
    multiset (Catalyst plans of the operator's attributes)."""

    plus: object
    minus: object


@dataclass
class Step:
    """One time's step: each source's version before and after, the sources that moved, how to
    read a source at a version and its change (plans of its columns), and what the operators
    computed for it so far."""

    catalyst: Catalyst
    before: dict[str, int]
    after: dict[str, int]
    #: A source's rows at a version (a DataFrame of its columns).
    read: Callable[[str, int], object]
    #: A source's change at this step: rows added and rows removed (DataFrames of its columns).
    source_change: Callable[[str], tuple[object, object]]
    #: Per operator and what of it (a side's value, its change), the plan built.
    built: dict[tuple[int, str], object] = field(default_factory=dict)
    #: Seconds spent holding state from a whole input (a first step's), shared by a step's times:
    #: the refresh policy weighs a step without them.
    setup: list[float] = field(default_factory=lambda: [0.0])

    @property
    def moved(self) -> frozenset[str]:
        return frozenset(name for name in self.after if self.after[name] != self.before.get(name))

    def versions(self, side: str) -> dict[str, int]:
        return self.before if side == "before" else self.after


class Operator:
    """A node of the plan and its children's operators; subclasses are delta rules."""

    #: What the rule does with a change, in words (for ``explain``).
    words = ""

    def __init__(self, node, children: list[Operator]):
        self.node = node
        self.children = children
        self.sources: frozenset[str] = frozenset().union(*(c.sources for c in children))

    def value(self, step: Step, side: str):
        """The node over its children's values at ``side`` (``before`` or ``after``)."""
        key = (id(self), side)
        if key not in step.built:
            step.built[key] = self._value(step, side)
        return step.built[key]

    def _value(self, step: Step, side: str):
        return self.with_children(step, [child.value(step, side) for child in self.children])

    def change(self, step: Step) -> Change | None:
        """The node's change at ``step`` (None where none of its sources moved)."""
        if not self.sources & step.moved:
            return None
        key = (id(self), "change")
        if key not in step.built:
            step.built[key] = self._change(step)
        return step.built[key]

    def _change(self, step: Step) -> Change:
        raise NotImplementedError

    def with_children(self, step: Step, children: list):
        """The node over other children (plans of its children's attributes)."""
        return self.node.withNewChildren(step.catalyst.seq(children)) if children else self.node

    def describe(self) -> str:
        """The operator tree under this one, in words: ``Name[rule](children)``."""
        inner = ", ".join(child.describe() for child in self.children)
        label = f"{self.node.nodeName()}{f' ({self.words})' if self.words else ''}"
        return f"{label}({inner})" if inner else label
