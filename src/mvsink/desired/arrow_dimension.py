"""A dimension's step computed in this process, the rest of the join held here as an Arrow table.

A linear aggregate over an inner join with a dimension ``D`` (:mod:`mvsink.desired.dimension`:
TPC-H Q3's customers) moves at each time by

    ``ΔD ⋈ R(before)  +  D(after) ⋈ ΔR``

with ``R`` the rest of the join aggregated by ``D``'s keys. Where the groups' state is held here
(:mod:`mvsink.desired.arrow_groups`), both terms are computed here too, with Arrow:

* ``R`` is held as an Arrow table in the types of Spark's (Spark aggregates it once,
  :meth:`~mvsink.desired.dimension.HeldRest.hold`, and it is collected);
* ``ΔD`` is ``D``'s change through its filters and projections, and ``ΔR`` the rest's own change
  terms, each by an :class:`~mvsink.desired.in_process.InProcessTerms` (over a plan of ``D`` alone,
  and over the rest's plan of the other sources: read from the files the commits name, the other
  sides pruned by the change's keys);
* ``D(after)`` is ``D``'s rows at the time's version in the files that can hold ``ΔR``'s keys;
* each term is Arrow's hash join on the keys: each pair's counts and sums in ``D``'s groups,
  negated where ``D``'s row is retracted. ``R`` then moves by ``ΔR``, summed per group and key.

An aggregate whose changed groups are recomputed from its input held here
(:mod:`mvsink.desired.arrow_recompute`: ``min``, ``max``, ``count(DISTINCT)``) moves the same way,
its input being a multiset: ``R`` is then the multiset of the rest's rows projected to the other
grouping columns, the aggregates' arguments and the keys, each with its count; a term's rows are
multiset rows of the input (the arguments carried through, the counts multiplied), which move
the input held, and its changed groups are recomputed from it.

A step declines (:class:`~mvsink.desired.in_process.Declined`) where either reader does, and
raises :class:`~mvsink.desired.arrow_plan.NotEvaluated` where a value does not fit its type;
nothing has moved then, and Spark computes the step.

Invariant: ``R`` after a step is Spark's ``R`` at its last time (the rest's aggregate at that
time's versions, its groups with rows), summed, in the types ``R`` was held in.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from mvsink.desired.arrow_groups import ArrowGroups, fitted, wide_type
from mvsink.desired.changes import SourceRead
from mvsink.desired.dimension import DimensionSplit
from mvsink.desired.in_process import InProcessTerms
from mvsink.desired.join import ranges_of_column
from mvsink.desired.linear_aggregate import ROWS
from mvsink.updates import DIFF, TIME


@dataclass(frozen=True)
class DimensionStep:
    """A step's change of the view's groups per time (state rows, as
    :meth:`~mvsink.desired.arrow_groups.ArrowGroups.state_rows` gives them), ``R`` after it, and
    the sources' reads."""

    changes: list[tuple[int, pa.Table]]
    rest: pa.Table
    reads: list[SourceRead]


class ArrowDimension:
    """How one view's dimension's steps are computed here: ``split`` (its dimension and keys),
    ``groups`` (how the view's groups' state, or its input's multiset, moves here), ``side`` (the terms of ``D``'s filters
    and projections over ``D`` alone) and ``rest`` (the terms of the rest's plan over the others)."""

    def __init__(self, split: DimensionSplit, groups: ArrowGroups, side: InProcessTerms, rest: InProcessTerms):
        self.split, self._groups, self._side, self._rest = split, groups, side, rest
        self._keys = [key for _, key in split.keys]
        #: The state columns of the dimension's grouping columns, and their names in its rows.
        self._dimension_groups = {groups.group_names[groups.aggregate.groups.index(g)]: g for g in split.groups}

    def step(self, held: pa.Table, state_schema: pa.Schema, times: list[int],
             versions: Callable[[int], dict[str, int]]) -> DimensionStep:
        """The change of the view's groups (whose state is in ``state_schema``) at each of
        ``times`` (``versions(t)``: the sources' versions at time ``t``), from ``held``, ``R`` at
        the time before them; :class:`Declined` or :class:`NotEvaluated` where it is Spark's."""
        dimension = self.split.dimension
        side, reads = self._side.terms(times, versions)
        rest, rest_reads = self._rest.terms(times, versions)
        reads = [*reads, *rest_reads]
        changes = []
        for time in times:
            parts = []
            changed = side.filter(pc.equal(side.column(TIME), time))
            if changed.num_rows:  # ΔD ⋈ R(before)
                parts.append(self._joined(held, changed))
            moved = rest.filter(pc.equal(rest.column(TIME), time))
            if moved.num_rows:  # D(after) ⋈ ΔR, and R moved by ΔR
                delta = self._groups.state_rows(moved, state_schema, tuple(self._keys))
                cuts = [(column, ranges_of_column(delta.column(key))) for column, key in self.split.source_keys]
                after, read = self._side.rows_of(dimension, versions(time)[dimension], cuts)
                reads += read
                parts.append(self._joined(delta, after.append_column(DIFF, pa.repeat(pa.scalar(1, pa.int64()),
                                                                                      after.num_rows))))
                held = self._summed(held, delta)
            if parts:
                changes.append((time, pa.concat_tables(parts)))
        return DimensionStep(changes, held, reads)

    def joined_at(self, held: pa.Table, version: int) -> tuple[pa.Table, list[SourceRead]]:
        """``held`` (``R`` at a time whose dimension's version is ``version``) joined with the
        dimension's rows at that version, read whole: the view's state rows of ``γ_G(D ⋈ R)``
        (not summed), and the read; :class:`Declined` where the rows are Spark's."""
        rows, reads = self._side.rows_of(self.split.dimension, version, [])
        return self._joined(held, rows.append_column(DIFF, pa.repeat(pa.scalar(1, pa.int64()), rows.num_rows))), reads

    def _joined(self, states: pa.Table, sides: pa.Table) -> pa.Table:
        """The view's state rows (wide values) of ``states`` (``R``'s rows) joined by the keys
        with ``sides`` (``D``'s rows through its filters and projections, each at its ``DIFF``):
        each pair's counts and sums, negated where the side's row is retracted, in ``D``'s groups."""
        wanted = [*(d for d, _ in self.split.keys), *self.split.groups, DIFF]
        renamed = [f"_mv_side{i}" for i in range(len(wanted))]
        side = sides.select(wanted).rename_columns(renamed)
        side_keys = renamed[:len(self._keys)]
        if states.num_rows >= side.num_rows:  # Arrow's hash join builds its table of the right side
            joined = states.join(side, keys=self._keys, right_keys=side_keys, join_type="inner", use_threads=False)
        else:
            joined = side.join(states, keys=side_keys, right_keys=self._keys, join_type="inner", use_threads=False)
        by_group = dict(zip(self.split.groups, renamed[len(self._keys):-1]))
        negated = pc.equal(joined.column(renamed[-1]), -1)
        columns = {}
        for name in self._groups.group_names:
            columns[name] = (joined.column(by_group[self._dimension_groups[name]]) if name in self._dimension_groups
                             else joined.column(name))
        for name in self._groups.argument_names:
            columns[name] = joined.column(name)
        for name in self._groups.value_names:
            value = pc.cast(joined.column(name), wide_type(states.schema.field(name).type))
            columns[name] = pc.if_else(negated, pc.negate(value), value)
        return pa.table(columns)

    def _summed(self, held: pa.Table, delta: pa.Table) -> pa.Table:
        """``held`` (``R``) moved by ``delta`` (state rows of the rest's change, with the keys):
        summed per group and key, the groups with no rows left out, in ``held``'s types."""
        columns = [*self._groups.group_names, *self._groups.argument_names, *self._keys]
        values = self._groups.value_names
        wide = pa.schema([pa.field(c, held.schema.field(c).type) for c in columns]
                         + [pa.field(c, wide_type(held.schema.field(c).type)) for c in values])
        both = pa.concat_tables([held.select(wide.names).cast(wide), delta.select(wide.names).cast(wide)])
        summed = both.group_by(columns, use_threads=False).aggregate([(c, "sum") for c in values])
        summed = summed.rename_columns([n.removesuffix("_sum") for n in summed.column_names])
        kept = summed.filter(pc.not_equal(summed.column(ROWS), 0))
        return pa.table({c: fitted(kept.column(c), held.schema.field(c).type) for c in held.schema.names})
