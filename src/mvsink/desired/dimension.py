"""A linear aggregate over an inner join, split at a *dimension*: the others' join aggregated, held.

TPC-H Q3 groups the revenue of orders ``O`` and their lines ``L`` by order and by the segment of
the order's customer ``C``. When customers move segment, the customers' term of the join's change,
``ΔC ⋈ O ⋈ L``, reads orders and lineitem whole: the moved customers' orders lie in every file.
Holding the rest of the join aggregated by the customer's key avoids that.

A source ``D`` of a linear aggregate over an inner join (its optimized plan over held rows) is a
dimension when the join reaches it only through equalities ``D.k = X.f`` of plain columns (``X``
another source) and ``D``'s own filters and projections, and its columns are read only by those
equalities and as grouping columns, never by an aggregate. Then, with ``Rest`` the join without
``D`` (every other node as it was, :meth:`DimensionSplit.rest_rows`) and ``R`` its aggregate
grouped by the view's grouping columns that are not ``D``'s and by the foreign keys ``f``,

    ``γ_G(D ⋈ Rest) = γ_G(D ⋈_{k = f} R)``

where the right side sums ``R``'s counts and sums over each row of ``D`` that joins (a row of ``D``
joining a group of ``R`` adds that group's sums once: the join distributes over the sums, duplicate
rows of ``D`` included). So a step's change, taking ``D``'s term first in the delta rule, is

    ``ΔD ⋈ R(before)  +  D(after) ⋈ ΔR``

with ``ΔR`` the rest's own terms (its sources' changes joined with the others, pruned by keys as
any join's terms, :mod:`mvsink.desired.join`), grouped into ``R``'s state rows. Neither term reads
the rest whole: ``ΔD`` meets ``R`` (held in Spark, as large as the view's state; or in the driver,
where the step is computed there: :mod:`mvsink.desired.arrow_dimension`), and ``ΔR`` is the
change's own work. ``R`` moves by ``ΔR`` at each time, held. ``R`` is held at the first step
where ``D`` moves (at the time before it), not by a hydration: until then a step's terms are any
join's, computed in the driver where they can be (a dimension that never changes, TPC-H Q8's
``part``, costs no step in Spark). A state held again while ``R`` is held is
computed from it, ``γ_G(D ⋈ R)`` (:meth:`HeldRest.groups_state`: the same sources read); after
:data:`QUIET_STEPS` steps in which ``D`` did not move, ``R`` is dropped, and held again when
``D`` moves.

The states here are :class:`~mvsink.desired.linear_aggregate.GroupStates`' rows of the view's
aggregate (its groups ``_mv_g<i>``, counts and sums); ``R``'s rows have ``D``'s grouping columns
null and the foreign keys ``_mv_k<j>`` besides. A row of ``Rest`` with a null foreign key joins no
row of ``D``: ``R`` leaves it out.

Invariant: ``R`` held at a time is the rest's aggregate at that time's versions (its groups with
rows), so that ``ΔD ⋈ R`` at the next time is ``D``'s term exactly.
"""

from __future__ import annotations

from functools import reduce

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink.correction import checkpointed
from mvsink.desired.aggregate_top import Catalyst
from mvsink.desired.arrow_groups import MOST_GROUPS
from mvsink.desired.in_process import local_relation
from mvsink.desired.join import INNER_JOINS
from mvsink.desired.linear_aggregate import GroupStates
from mvsink.desired.row_wise import HELD_ROWS, conjuncts, plan_is_row_wise, plan_leaves, references, scala_items

#: The column of a dimension's row's sign in :meth:`HeldRest.joined`.
_SIGN = "_mv_sign"
#: The fraction of ``R``'s size that the changes held beside it may reach before they are summed into it.
COMPACTED = 0.25
#: Steps without a change of the dimension after which ``R`` is dropped (and the join's terms
#: read the dimension's change with the others again).
QUIET_STEPS = 10


class _NotSplit(Exception):
    """The plan cannot be split at the dimension."""


class DimensionSplit:
    """A linear aggregate's input split at its dimension (see the module doc), as
    :func:`split_at_dimension` finds it: ``rest``, the aggregate's input plan without the
    dimension, and ``side``, the dimension's filters and projections, both over rows held per
    source (``leaves``: each held leaf's RDD id -> its source's name); ``keys``, the equalities
    ``(dimension's attribute, the other's)``; ``groups``, the dimension's grouping columns;
    ``owners``, the source of each leaf attribute (by id), to name the equalities in words."""

    def __init__(self, like: DataFrame, dimension: str, rest, side, keys: list[tuple], groups: list[str],
                 leaves: dict[int, str], owners: dict[int, str]):
        self._like, self._nodes = like, Catalyst(like.sparkSession.sparkContext._jvm)
        #: The Spark session of the aggregate's rows.
        self.session = like.sparkSession
        #: The dimension source's name, and its grouping columns (names of the aggregate's input).
        self.dimension, self.groups = dimension, tuple(groups)
        self._rest, self._side, self._leaves = rest, side, leaves
        #: ``(the dimension's key column, the foreign key's column _mv_k<j>)`` for each equality.
        self.keys = [(d.name(), f"_mv_k{j}") for j, (d, _) in enumerate(keys)]
        #: The equalities, in words: ``customers.cust = orders.cust``.
        self.equalities = ", ".join(f"{dimension}.{d.name()} = {owners.get(f.exprId().id(), 'the join')}.{f.name()}"
                                    for d, f in keys)
        #: ``(the dimension source's column, _mv_k<j>)`` for each equality whose dimension's side
        #: is that column as it is (not computed), by which its files can be pruned.
        leaf_ids = {a.exprId().id() for leaf in plan_leaves(side) for a in scala_items(leaf.output())}
        self.source_keys = [(d.name(), f"_mv_k{j}") for j, (d, _) in enumerate(keys) if d.exprId().id() in leaf_ids]
        #: The type of each of the dimension's grouping columns (a SQL type name).
        self.group_types = {a.name(): a.dataType().simpleString() for a in scala_items(side.output())
                            if a.name() in self.groups}

    def rest_rows(self, sources: dict[str, DataFrame]) -> DataFrame:
        """The aggregate's input without the dimension over ``sources`` (by name; each in its
        source's columns): the aggregate's input columns but the dimension's, the foreign keys as
        ``_mv_k<j>`` (not null) and each computed argument as ``_mv_in<i>``."""
        return self._nodes.frame(self._like, self._rebound(self._rest, sources))

    def side_rows(self, rows: DataFrame) -> DataFrame:
        """The dimension's filters and projections over ``rows`` (in the dimension's columns)."""
        return self._nodes.frame(self._like, self._rebound(self._side, {self.dimension: rows}))

    def _rebound(self, plan, sources: dict[str, DataFrame]):
        """``plan`` with each held leaf read from its source in ``sources``, under the leaf's
        attributes (aliased by name: the nodes above refer to them by id)."""
        children = scala_items(plan.children())
        if not children:
            rows = sources[self._leaves[plan.rdd().id()]]._jdf.queryExecution().analyzed()
            by_name = {a.name(): a for a in scala_items(rows.output())}
            return self._nodes.logical.Project(self._nodes.seq([
                self._nodes.alias(by_name[a.name()], a.name(), a.exprId()) for a in scala_items(plan.output())]), rows)
        return plan.withNewChildren(self._nodes.seq([self._rebound(child, sources) for child in children]))


def split_at_dimension(core: DataFrame, leaves: dict[int, str], arguments: list, computed: list[str]
                       ) -> DimensionSplit | None:
    """The first source of ``core`` (a linear aggregate's core over held rows, its leaves named by
    ``leaves``, in their order) that is a dimension (see the module doc), split there; None where
    none is. ``arguments`` are the aggregate's argument expressions (None: a grouping column or
    ``count(*)``), ``computed`` the input column each computed one is given (None: read as it is)."""
    plan = core._jdf.queryExecution().optimizedPlan()
    if plan.nodeName() != "Aggregate":
        return None
    for rdd_id, name in leaves.items():
        try:
            return _split(core, plan, rdd_id, name, leaves, arguments, computed)
        except _NotSplit:
            continue
    return None


def _split(core: DataFrame, plan, rdd_id: int, name: str, leaves: dict[int, str], arguments: list,
           computed: list[str]) -> DimensionSplit:
    """:func:`split_at_dimension` at source ``name`` (its held leaf's RDD id ``rdd_id``)."""
    nodes = Catalyst(core.sparkSession.sparkContext._jvm)
    found: dict = {}  # "side": the dimension's subtree; "ids": its output's attribute ids

    def without(node):
        """``node`` without the dimension (None: it is the dimension's subtree), and the
        equalities ``(dimension's attribute, the other's)`` that joined it, below ``node``."""
        kind = node.nodeName()
        reads = {leaf.rdd().id() for leaf in plan_leaves(node)}
        if rdd_id not in reads:
            return node, []
        if reads == {rdd_id}:
            if not plan_is_row_wise(node, HELD_ROWS):
                raise _NotSplit
            found["side"], found["ids"] = node, _ids(node.output())
            return None, []
        if kind == "Join" and node.joinType().toString() in INNER_JOINS:
            (left, below_left), (right, below_right) = without(node.left()), without(node.right())
            pairs = below_left + below_right
            condition = conjuncts(node.condition().get()) if node.condition().isDefined() else []
            if left is not None and right is not None:
                if any(references(c) & found["ids"] for c in condition):
                    raise _NotSplit
                return node.withNewChildren(nodes.seq([left, right])), pairs
            other = left if left is not None else right
            kept = []
            for conjunct in condition:
                if not references(conjunct) & found["ids"]:
                    kept.append(conjunct)
                elif (conjunct.nodeName() == "EqualTo" and all(side.nodeName() == "AttributeReference"
                                                             for side in (conjunct.left(), conjunct.right()))):
                    a, b = conjunct.left(), conjunct.right()
                    d, f = (a, b) if a.exprId().id() in found["ids"] else (b, a)
                    if f.exprId().id() in found["ids"]:
                        raise _NotSplit
                    pairs.append((d, f))
                else:
                    raise _NotSplit
            if not pairs:
                raise _NotSplit
            return (nodes.logical.Filter(reduce(lambda x, y: nodes.and_(x, y), kept), other) if kept else other), pairs
        if kind == "Filter":
            child, pairs = without(node.child())
            if child is None or references(node.condition()) & found["ids"]:
                raise _NotSplit
            return node.withNewChildren(nodes.seq([child])), pairs
        if kind == "Project":
            child, pairs = without(node.child())
            if child is None:
                raise _NotSplit
            kept = []
            for expression in scala_items(node.projectList()):
                if expression.nodeName() == "AttributeReference" and expression.exprId().id() in found["ids"]:
                    continue
                if references(expression) & found["ids"]:
                    raise _NotSplit
                kept.append(expression)
            present = {e.exprId().id() for e in kept}
            below = _ids(child.output())
            kept += [f for _, f in pairs if f.exprId().id() not in present and f.exprId().id() in below]
            return nodes.logical.Project(nodes.seq(kept), child), pairs
        raise _NotSplit

    rest, pairs = without(plan.child())
    if rest is None or not pairs or any(a is not None and references(a) & found["ids"] for a in arguments):
        raise _NotSplit
    groups = [g.name() for g in scala_items(plan.groupingExpressions()) if g.exprId().id() in found["ids"]]
    inputs = _ids(plan.child().output())  # not the foreign keys carried up only to be _mv_k<j>
    named = [*(a for a in scala_items(rest.output()) if a.exprId().id() in inputs),
             *(nodes.alias(f, f"_mv_k{j}", nodes.new_expr_id()) for j, (_, f) in enumerate(pairs)),
             *(nodes.alias(a, c, nodes.new_expr_id()) for a, c in zip(arguments, computed) if c is not None)]
    condition = reduce(lambda x, y: nodes.and_(x, y), [nodes.is_not_null(f) for _, f in pairs])
    rest = nodes.logical.Project(nodes.seq(named), nodes.logical.Filter(condition, rest))
    owners = {a.exprId().id(): leaves.get(leaf.rdd().id()) for leaf in plan_leaves(plan)
              for a in scala_items(leaf.output())}
    return DimensionSplit(core, name, rest, found["side"], pairs, groups, leaves, owners)


def _ids(attributes) -> set[int]:
    return {a.exprId().id() for a in scala_items(attributes)}



class HeldRest:
    """``R`` of the module doc for one view: the aggregate's state (``states``, the view's
    :class:`~mvsink.desired.linear_aggregate.GroupStates`) of the rest of the join, held at
    :attr:`time` in Spark (:attr:`state`) or in this process as an Arrow table (:meth:`arrow`,
    moved by :mod:`mvsink.desired.arrow_dimension`), and how the dimension's and the rest's
    changes meet it in Spark."""

    def __init__(self, split: DimensionSplit, states: GroupStates):
        self.split, self._states = split, states
        self._keys = tuple(k for _, k in split.keys)
        names, groups = states.group_names, states.aggregate.groups
        #: The dimension's grouping columns: their state columns and their names in its rows.
        self._dimension_groups = {names[groups.index(g)]: g for g in split.groups}
        self._null_groups = [F.lit(None).cast(split.group_types[g]).alias(g) for g in split.groups]
        self._columns = [*names, *states.value_names]
        self._state: DataFrame | None = None
        #: ``R`` as an Arrow table where it is held here (then :attr:`state` is made from it when
        #: Spark needs it), in the types of Spark's (``_schema``).
        self._arrow: pa.Table | None = None
        self._schema: T.StructType | None = None
        self.time: int | None = None
        self.size = 0
        self._quiet = 0
        #: Rows of changes held beside the summed state (see :meth:`move`).
        self._beside = 0

    def as_state(self, rest: DataFrame, diff: int) -> DataFrame:
        """Rows of the rest (:meth:`DimensionSplit.rest_rows`) at ``diff`` as ``R``'s state rows."""
        return self._states.rows_as_state(rest.select("*", *self._null_groups), diff, self._keys)

    @property
    def state(self) -> DataFrame | None:
        """``R`` held, as a Spark DataFrame (a local relation where it is held here); None where none is."""
        if self._state is None and self._arrow is not None:
            self._state = local_relation(self.split.session, self._arrow, self._schema)
        return self._state

    @state.setter
    def state(self, state: DataFrame | None) -> None:
        self._state, self._arrow = state, None

    def hold(self, time: int, rest: DataFrame) -> None:
        """``R`` at ``time``: the rest's rows at its versions, summed, held."""
        self.state, self.size = checkpointed(self._summed(self.as_state(rest, 1)))
        self.time, self._quiet, self._beside = time, 0, 0

    def arrow(self) -> pa.Table | None:
        """``R`` held, as an Arrow table (collected once from Spark where it was held there,
        the changes beside it summed first); None where it has more than
        :data:`~mvsink.desired.arrow_groups.MOST_GROUPS` groups."""
        if self._arrow is None:
            if self._beside:
                self.state, self.size = checkpointed(self._summed(self.state))
                self._beside = 0
            if self.size > MOST_GROUPS:
                return None
            self._schema = self._state.schema
            self._arrow = self._state.toArrow()
        return self._arrow

    def hold_arrow(self, time: int, rest: pa.Table) -> None:
        """``R`` at ``time``: ``rest``, in the types of :meth:`arrow`'s, held here."""
        self._state, self._arrow, self.time, self.size = None, rest, time, rest.num_rows

    def move(self, time: int, changed: DataFrame, rows: int) -> None:
        """``R`` at ``time``: ``R`` at the time before and ``changed`` (``rows`` state rows, held),
        summed into one held state once the changes held beside it pass :data:`COMPACTED` of its
        size (until then a join with ``R`` reads them too: it is linear, so they need not be summed)."""
        self.state, self.time, self._beside = self.state.unionByName(changed), time, self._beside + rows
        if self._beside > COMPACTED * self.size:
            self.state, self.size = checkpointed(self._summed(self.state))
            self._beside = 0

    def joined(self, states: DataFrame, sides: list[tuple[DataFrame, int]]) -> DataFrame:
        """The view's state rows of ``states`` (``R``'s rows) joined by the keys with the rows of
        ``sides`` (the dimension's rows, :meth:`DimensionSplit.side_rows`, each part at its sign),
        in one join: each pair's counts and sums, negated where the side's sign is -1, in the
        dimension's groups."""
        side = reduce(DataFrame.unionByName, [rows.withColumn(_SIGN, F.lit(sign)) for rows, sign in sides])
        condition = reduce(lambda a, b: a & b, [states[k] == side[d] for d, k in self.split.keys])
        joined = states.join(side, condition)
        negated = side[_SIGN] < 0
        columns = []
        for name in self._columns:
            if name in self._dimension_groups:
                columns.append(side[self._dimension_groups[name]].alias(name))
            elif name in self._states.value_names:  # negated as it is: its type stays
                columns.append(F.when(negated, -states[name]).otherwise(states[name]).alias(name))
            else:
                columns.append(states[name].alias(name))
        return joined.select(*columns)

    def groups_state(self, dimension_rows: DataFrame) -> DataFrame:
        """The view's groups' state at :attr:`time` from ``R`` held and ``dimension_rows`` (the
        dimension source's rows at that time's version): ``γ_G(D ⋈ R)`` of the module doc, one row
        per group (one without ``GROUP BY`` even where no row joins, as the aggregate's)."""
        return self._states.summed(self.joined(self.state, [(self.split.side_rows(dimension_rows), 1)]))

    def stepped(self, dimension_moves: bool) -> bool:
        """Whether a step keeps ``R`` (held or to be held): where the dimension's version moves,
        and until :data:`QUIET_STEPS` steps in a row have not moved it (then ``R`` is dropped)."""
        self._quiet = 0 if dimension_moves else self._quiet + 1
        if self._quiet >= QUIET_STEPS or self._state is None and self._arrow is None and not dimension_moves:
            self.state = self.time = None
            return False
        return True

    def _summed(self, states: DataFrame) -> DataFrame:
        """``states`` summed per group and key, the groups with no rows left out."""
        return self._states.summed(states, *self._keys).where(F.col(self._states.value_names[0]) != 0)
