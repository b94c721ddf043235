"""Whether a snapshot view's query is *per-group*, and its changes by recomputing the changed groups.

A query is per-group when its rows fall into groups, each group's rows depending only on the
source rows with one value of some columns (a null is a value: a group), and those columns are the
sources' own, passed through unchanged (:func:`~mvsink.desired.row_wise.leaf_columns`). Its
optimized logical plan, every expression deterministic and no subquery, is one of:

* an **aggregate of one source** grouped by its columns: one ``Aggregate`` (under any projections
  and filters: ``HAVING``, expressions of aggregates) grouping by source columns (at least one) over
  a row-wise query of the source (:mod:`mvsink.desired.row_wise`); the group's value is that of the
  grouping columns;
* a **key join** of several sources: projections, filters and joins (inner, left, right and full
  outer, semi, anti) over one scan per source, each read once, where some columns, one per source
  (or a few: a composite key), are equated by every join's condition (a conjunct ``a = b`` between
  the two sides' columns); optionally under one ``Aggregate`` grouping by such a column of a source
  no outer join pads with nulls (so the group holds one key). Every row of a join holds rows of
  its sources with one key value (a join matches only equal keys), and whether a row is padded
  depends only on the other side's rows of that key: the group's value is the key's. A side may
  be an aggregate of one source grouped by its key column (and maybe more), as a view over an
  aggregate view is: each of its rows depends only on the source's rows of one key;
* an **aggregate of a join** grouped by columns of its sources: one ``Aggregate`` over
  projections, filters and joins (inner; left and right outer, semi and anti) of one scan per
  source, each read once (no union), grouping by source columns. A side may be an aggregate of
  one source (a grouped subquery, ``IN (SELECT k FROM s GROUP BY k HAVING ...)``: TPC-H Q18) where
  that source holds ``R`` (below) by a column the aggregate groups by: its rows of one value of
  that column are whole groups of it. A scan the optimizer repeats (the subquery again on the
  join's other side, inferred from its equality) is one source, each of its places joined by
  that column to one equal to ``R``. Every row of
  an inner join satisfies every equality of its condition, so a grouping column equals, in every
  row, each column the inner joins equate it with (an outer join's equality does not hold in the
  rows it pads). The group's value is that of some of the grouping columns, ``R``: those one
  source no outer join pads (every row of the join holds one of its rows) holds (has such a
  column for), chosen so that the most sources hold all of ``R`` (Q3's order key, which orders and
  lineitem hold, not the customer's segment). A padded source holds ``R`` where a join's equality
  makes a column of it equal to such a column of an unpadded source (its row is in a row only
  where that join matched it: ``orders LEFT JOIN lineitem`` grouped by the order key). A group of
  ``R`` is a union of the query's groups, each whole: those sources' rows with its value, joined
  with the other sources whole, are all the rows of the join with it. The sources that do not
  hold ``R`` (at least one: else a key join) are read *whole*: which groups their changes touch
  is found by joining their changes with the other sources, as an inner join's change is
  (:mod:`mvsink.desired.join`), in the rows that hold a changed row (:func:`holding_rows_of`: a
  join that would pad the change's side with nulls made one that does not, the filters above it
  that read that side dropped: ``WHERE o_orderkey IS NULL`` passes a padded row, not the
  matched one the change makes of it; ``G(t)`` is then
  ``R`` of those rows at ``t``, each source's own or found so), and in a recompute they are read
  in full, the sources that hold ``R`` only in ``G(t)``.

Every aggregate function must be one whose result does not depend on the order of its rows
(:data:`ORDER_FREE`: ``min``, ``max``, ``count`` and ``count(DISTINCT ...)``, ``percentile``, and
``sum`` and ``avg`` of integers and decimals (:data:`EXACT_INPUT`); not ``first``,
``collect_list``, ``max_by``, nor sums, averages and deviations of floating point, whose last bits
depend on how Spark splits the rows among tasks). A linear aggregate
(:mod:`mvsink.desired.linear_aggregate`) and an inner join (:mod:`mvsink.desired.join`) keep their
own strategies, cheaper; this one takes the others.

With ``G(t)`` the distinct group values of the sources' rows changed at time ``t`` (inserted and
deleted, of every source that moved), every group outside ``G(t)`` has the same source rows at ``t``
as at the time before, so the same output rows: the view's change at ``t`` is the query over the
sources at ``t``'s versions restricted to ``G(t)`` at +1, and over the versions before restricted to
``G(t)`` at -1, consolidated. The restriction is applied to each source's rows, below the joins and
the aggregate (:func:`in_groups`, null-safe; of an inner join's sources, to those that hold the
groups), after the read is pruned to a few ranges of ``G``'s
values (:func:`~mvsink.desired.join.pruned`), and only the files that can hold those values are
read (listed by :mod:`~mvsink.desired.listed_files`, else skipped by Delta's data skipping);
:class:`~mvsink.desired.snapshot.SnapshotDesired` reads the changes and the ranges once per step.
A listed file both versions hold (every file of a source that did not move; most of one that did)
is read once for both: the restricted rows of those files are one shuffle that the two versions'
plans share, which Spark runs once (a reused exchange).

Invariant: the rows retracted for a group at ``t`` are the rows the group had, recomputed from the
versions before; they equal the rows added for it earlier, because every aggregate taken gives the
same result however Spark splits the rows among tasks (a floating-point sum would not: which files
a step's read prunes changes the split, and a retraction off in its last bit would leave the old row
in the view). An average of integers is a sum of doubles in Spark, exact while the sums stay within
2**53, as for a linear aggregate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mvsink.desired.aggregate_top import Catalyst
from mvsink.desired.row_wise import (ROW_WISE_NODES, conjuncts, leaf_columns, plan_is_row_wise, references,
                                     scala_items, under_row_wise)

#: Aggregate functions (Catalyst's names) whose result does not depend on the order of the rows.
ORDER_FREE = frozenset({"Min", "Max", "Count", "Percentile", "HyperLogLogPlusPlus"})
#: ... and those whose result does not where their input is exact (integral or decimal), not
#: floating point.
EXACT_INPUT = frozenset({"Sum", "Average"})
_FLOATING = frozenset({"float", "double"})
#: Join types whose rows of a key depend only on the sides' rows of that key, and which sides'
#: rows every output row holds (not padded with nulls): left, right.
_KEY_JOINS = {"Inner": (True, True), "LeftOuter": (True, False), "RightOuter": (False, True),
              "FullOuter": (False, False), "LeftSemi": (True, False), "LeftAnti": (True, False)}
#: Join types an aggregate of a join may have (not full outer: it pads every source).
_GROUPED_JOINS = frozenset(_KEY_JOINS) - {"FullOuter"}
#: Per join type, the type that keeps only the rows holding a row of its left (right) side, where
#: the type would pad that side or drop its matches (:func:`holding_rows_of`); None: it keeps
#: them already.
_HOLDING = {"LeftOuter": (None, "Inner"), "RightOuter": ("Inner", None), "LeftAnti": (None, "LeftSemi")}


@dataclass(frozen=True)
class PerGroup:
    """The shape of a per-group query: per source that holds the groups (by its name), the columns
    whose values are a row's group, in the same order for every source (a key join's equated
    columns line up); for an aggregate of a join, the sources that do not hold them, read
    whole."""

    keys: dict[str, tuple[str, ...]]
    whole: tuple[str, ...] = ()
    #: For an aggregate of a join: the grouping columns (by place) that ``keys`` are, ``R``.
    grouping: tuple[int, ...] = ()

    @property
    def joins(self) -> bool:
        """Whether the query is a key join of several sources (else an aggregate of one, or of a
        join)."""
        return len(self.keys) > 1 and not self.whole

    @property
    def strategy(self) -> str:
        """The strategy's name, as a step reports it."""
        return "per-key recompute" if self.joins else "per-group recompute"


def per_group(result: DataFrame, scan: str, names: dict[int, str] | None = None) -> PerGroup | None:
    """The shape of ``result`` (a query over ``scan`` leaves) if it is per-group. ``names`` maps a
    leaf of rows held in Spark (by its RDD's id) to its source's name; every leaf must be one, each
    read once. Without it (a query over the sources, its shape checked before the rows are held),
    the leaves are named by their order."""
    node = under_row_wise(result)
    if node is None:
        return None
    aggregate = node if node.nodeName() == "Aggregate" else None
    if aggregate is not None and not all(
            _order_free(f) for e in scala_items(aggregate.aggregateExpressions()) for f in _functions(e)):
        return None
    below = aggregate.child() if aggregate is not None else node
    if plan_is_row_wise(below, scan):
        return _one_source(aggregate, below, names)
    tree = _KeyJoin.of(below, scan)
    if tree is None or not _distinct_sources(tree.leaves, names):
        return None
    name = (lambda i, leaf: names[leaf.rdd().id()]) if names is not None else (lambda i, leaf: f"source {i + 1}")
    keys = tree.keys()
    if keys and (aggregate is None or tree.groups_hold_keys(aggregate, keys)):
        return PerGroup({name(i, leaf): tuple(key[i] for key in keys) for i, leaf in enumerate(tree.leaves)})
    found = tree.holding_groups(aggregate) if aggregate is not None else None
    if found is None:
        return None
    grouping, held = found
    return PerGroup({name(i, tree.leaves[i]): columns for i, columns in held.items()},
                    tuple(name(i, leaf) for i, leaf in enumerate(tree.leaves) if i not in held), grouping)


def _one_source(aggregate, below, names: dict[int, str] | None) -> PerGroup | None:
    """An aggregate of one source (``below``: a row-wise query of it) grouped by its columns."""
    if aggregate is None:
        return None  # row-wise: another strategy
    groups = scala_items(aggregate.groupingExpressions())
    if not groups or any(g.nodeName() != "AttributeReference" for g in groups):
        return None
    columns = leaf_columns(below, [g.exprId().id() for g in groups])
    leaf = below
    while leaf.nodeName() in ROW_WISE_NODES:
        leaf = leaf.children().head()
    name = names.get(leaf.rdd().id()) if names is not None else "source 1"
    return PerGroup({name: columns}) if columns is not None and name is not None else None


def _distinct_sources(leaves: list, names: dict[int, str] | None) -> bool:
    """Whether ``leaves`` are distinct sources: each named (by ``names``, where given) and none
    twice; without names, no two reading the same columns (of the same ids: a source read twice
    is two reads of their own ids, which the query names as two sources, :mod:`~mvsink.desired.occurrences`;
    the rows held then tell by name)."""
    if names is not None:
        return len({names.get(leaf.rdd().id()) for leaf in leaves} - {None}) == len(leaves)
    ids = [{a.exprId().id() for a in scala_items(leaf.output())} for leaf in leaves]
    return not any(a & b for i, a in enumerate(ids) for b in ids[i + 1:])


class _KeyJoin:
    """A plan of projections, filters and key joins (:data:`_KEY_JOINS`) over scans and
    aggregates of one scan: its leaves (in order), the joins' equalities between the leaves'
    columns, and the leaves no outer join pads."""

    def __init__(self):
        self.leaves: list = []
        self.kept: set[int] = set()  # indexes of the leaves every output row holds
        #: Per join, its type and the equalities of its condition: pairs of (leaf index, column).
        self.kinds: list[str] = []
        self.equalities: list[list[tuple[tuple[int, str], tuple[int, str]]]] = []
        #: The indexes of the leaves under an aggregate of one leaf (a grouped subquery's).
        self.aggregated: set[int] = set()
        #: How many times each leaf (by index) is in the plan: the optimizer repeats a semi join's
        #: subquery where a join's equality infers it for the other side too (TPC-H Q18).
        self.occurrences: dict[int, int] = {}

    @classmethod
    def of(cls, plan, scan: str) -> _KeyJoin | None:
        tree = cls()
        return tree if tree._walk(plan, scan, True) and tree.equalities else None

    def _walk(self, node, scan: str, kept: bool) -> bool:
        name = node.nodeName()
        if name in ROW_WISE_NODES:
            return self._walk(node.children().head(), scan, kept)
        if name == "Join":
            sides = _KEY_JOINS.get(node.joinType().toString())
            if sides is None or not (self._walk(node.left(), scan, kept and sides[0])
                                     and self._walk(node.right(), scan, kept and sides[1])):
                return False
            condition = node.condition()
            pairs = []
            for expression in conjuncts(condition.get()) if condition.isDefined() else []:
                pair = self._equality(node, expression)
                if pair is not None:
                    pairs.append(pair)
            self.kinds.append(node.joinType().toString())
            self.equalities.append(pairs)
            return True
        if name == "Aggregate":  # of one leaf; only its grouping columns trace through it (_trace)
            if not (plan_is_row_wise(node.child(), scan) and all(
                    _order_free(f) for e in scala_items(node.aggregateExpressions()) for f in _functions(e))
                    and self._walk(node.child(), scan, kept)):
                return False
            self.aggregated.add(self._index_of(node.child()))
            return True
        if name != scan or not node.children().isEmpty():
            return False
        index = self._index_of(node)
        if index is None:  # a scan the optimizer repeats (a semi join's subquery, inferred again) is one leaf
            index = len(self.leaves)
            self.leaves.append(node)
        self.occurrences[index] = self.occurrences.get(index, 0) + 1
        if kept:
            self.kept.add(index)
        return True

    def _index_of(self, node) -> int | None:
        """The index of the leaf ``node`` is (or is above, through projections and filters): the same
        scan, its columns of the same ids; None if it is none of them."""
        while node.nodeName() in ROW_WISE_NODES:
            node = node.children().head()
        return next((i for i, leaf in enumerate(self.leaves) if leaf.equals(node)), None)

    def _equality(self, join, expression) -> tuple[tuple[int, str], tuple[int, str]] | None:
        """``expression`` (a conjunct of ``join``'s condition) as the two leaf columns it equates,
        one of each side, if it is ``a = b`` (or ``a <=> b``) of columns passed through."""
        if expression.nodeName() not in ("EqualTo", "EqualNullSafe"):
            return None
        a, b = expression.left(), expression.right()
        if a.nodeName() != "AttributeReference" or b.nodeName() != "AttributeReference":
            return None
        for x, y in ((a, b), (b, a)):
            left, right = self._trace(join.left(), x.exprId().id()), self._trace(join.right(), y.exprId().id())
            if left is not None and right is not None:
                return left, right
        return None

    def _trace(self, node, attribute: int) -> tuple[int, str] | None:
        """The leaf (index) and column that ``node``'s output ``attribute`` is, value for value."""
        while True:
            name = node.nodeName()
            if name == "Project":
                found = [e for e in scala_items(node.projectList()) if e.exprId().id() == attribute]
                source = found[0].child() if found and found[0].nodeName() == "Alias" else (found or [None])[0]
                if source is None or source.nodeName() != "AttributeReference":
                    return None
                attribute, node = source.exprId().id(), node.child()
            elif name == "Filter":
                node = node.child()
            elif name == "Aggregate":  # a grouping column passes through; an aggregate's result is new
                if not any(g.nodeName() == "AttributeReference" and g.exprId().id() == attribute
                           for g in scala_items(node.groupingExpressions())):
                    return None
                node = node.child()
            elif name == "Join":
                side = [c for c in (node.left(), node.right())
                        if any(a.exprId().id() == attribute for a in scala_items(c.output()))]
                if not side:
                    return None
                node = side[0]
            else:
                index = self._index_of(node)
                names = {a.exprId().id(): a.name() for a in scala_items(node.output())}
                return (index, names[attribute]) if index is not None and attribute in names else None

    def _classes(self, inner: bool = False) -> list[list[tuple[int, str]]]:
        """The leaf columns the joins' equalities name, in classes: those connected by them (with
        ``inner``, by the inner joins' alone, which hold in every row)."""
        parent: dict = {}

        def root(x):
            while parent.setdefault(x, x) != x:
                x = parent[x]
            return x

        for kind, pairs in zip(self.kinds, self.equalities):
            for a, b in pairs if kind == "Inner" or not inner else ():
                parent[root(a)] = root(b)
        classes: dict = {}
        for column in parent:
            classes.setdefault(root(column), []).append(column)
        return list(classes.values())

    def keys(self) -> list[tuple[str, ...]]:
        """The keys: sets of columns, one of each leaf (by leaf index), that every join equates
        (its leaf columns connected by the joins' equalities; through an aggregate, only a
        column it groups by is one); none if there is none."""
        keys = []
        for members in self._classes():
            by_leaf = dict(members)
            if len(by_leaf) != len(members) or len(by_leaf) != len(self.leaves):
                continue  # a leaf with two columns in it, or none
            if all(any(a in members for a, _ in pairs) for pairs in self.equalities):
                keys.append(tuple(by_leaf[i] for i in range(len(self.leaves))))
        return keys

    def holding_groups(self, aggregate) -> tuple[tuple[int, ...], dict[int, tuple[str, ...]]] | None:
        """Where ``aggregate`` groups a join (:data:`_GROUPED_JOINS`, no aggregate below) by
        columns of its leaves: ``R``, grouping columns (by place) that a leaf no outer join pads
        holds (all it holds, or those another leaf holds too), chosen so that the most leaves hold
        them (then the most columns), and those
        leaves (by index), each with its columns equal to ``R`` in every row it has a row in;
        None if the join is not one, a grouping column is not a leaf's column, or every leaf
        holds ``R`` (a key join, another strategy's). A leaf no outer join pads holds a grouping
        column where the inner joins' equalities (which hold in every row) make a column of it
        equal to it; a padded leaf, where a join's equality makes a column of it equal to such a
        leaf's column (a row of it is in a row only where that join matched it)."""
        groups = scala_items(aggregate.groupingExpressions())
        if (not groups or any(g.nodeName() != "AttributeReference" for g in groups)
                or not set(self.kinds) <= _GROUPED_JOINS):
            return None
        traced = [self._trace(aggregate.child(), g.exprId().id()) for g in groups]
        if None in traced:
            return None
        classes = {column: members for members in self._classes(inner=True) for column in members}

        def column(leaf: int, group: tuple[int, str]) -> str | None:
            """The leaf's column equal to the grouping column in every row it has a row in (None:
            it has none)."""
            kept = [(i, c) for i, c in classes.get(group, [group]) if i in self.kept]
            if leaf in self.kept:
                return min((c for i, c in kept if i == leaf), default=None)
            return min((a[1] for pairs in self.equalities for x, y in pairs for a, b in ((x, y), (y, x))
                        if a[0] == leaf and b in kept), default=None)

        holds = [{k for k, g in enumerate(traced) if column(i, g) is not None} for i in range(len(self.leaves))]
        best = ((), {})
        for i in range(len(self.leaves)):  # those one unpadded leaf holds, and of them those another leaf holds
            for grouping in (tuple(sorted(holds[i] & holds[k])) for k in (i, *sorted(self.kept)) if k in self.kept):
                held = {j: tuple(column(j, traced[k]) for k in grouping) for j in range(len(self.leaves))
                        if set(grouping) <= holds[j]}
                if grouping and (len(held), len(grouping)) > (len(best[1]), len(best[0])):
                    best = (grouping, held)
        if not 0 < len(best[1]) < len(self.leaves) or not self.aggregated <= set(best[1]):
            return None  # every leaf holds R (a key join), or an aggregated leaf is read whole
        grouping, held = best
        for leaf in (i for i, n in self.occurrences.items() if n > 1):
            # Each of its places joins it by its column equal to R to a kept leaf's column equal to R.
            touching = [(a, b) for pairs in self.equalities for x, y in pairs for a, b in ((x, y), (y, x))
                        if a[0] == leaf]
            if leaf not in held or len(touching) < self.occurrences[leaf] or not all(
                    any(a[1] == held[leaf][n] and b[0] in self.kept and b in classes.get(traced[k], [traced[k]])
                        for n, k in enumerate(grouping)) for a, b in touching):
                return None
        return best

    def groups_hold_keys(self, aggregate, keys: list[tuple[str, ...]]) -> bool:
        """Whether ``aggregate`` (over the join) groups by, for every key, a column of it of a leaf
        that every output row holds, so each group holds one key's rows."""
        grouped = [self._trace(aggregate.child(), g.exprId().id()) for g in scala_items(aggregate.groupingExpressions())
                   if g.nodeName() == "AttributeReference"]
        return all(any(g is not None and g[0] in self.kept and key[g[0]] == g[1] for g in grouped) for key in keys)


def _functions(expression) -> list:
    """The aggregate functions in ``expression`` (Catalyst's)."""
    if expression.nodeName() == "AggregateExpression":
        return [expression.aggregateFunction()]
    return [function for child in scala_items(expression.children()) for function in _functions(child)]


def _order_free(function) -> bool:
    """Whether ``function``'s result is the same in any order of its rows (:data:`ORDER_FREE`,
    :data:`EXACT_INPUT`)."""
    name = function.nodeName()
    if name in EXACT_INPUT:
        return all(child.dataType().typeName() not in _FLOATING for child in scala_items(function.children()))
    return name in ORDER_FREE


def in_groups(rows: DataFrame, groups: DataFrame, columns: tuple[str, ...], small: bool) -> DataFrame:
    """``rows`` whose ``columns`` equal those of a row of ``groups`` (its distinct values of
    them, in that order, named as they are), nulls equal to nulls: a semi-join (``groups``
    broadcast if ``small``)."""
    groups = groups.toDF(*[f"_group_{i}" for i in range(len(columns))])
    condition = reduce(lambda a, b: a & b, [rows[c].eqNullSafe(groups[f"_group_{i}"]) for i, c in enumerate(columns)])
    return rows.join(F.broadcast(groups) if small else groups, condition, "left_semi")


def holding_rows_of(result: DataFrame, rows: DataFrame) -> DataFrame:
    """The rows of ``result`` (projections, filters and joins over leaves, ``rows`` one of them,
    held in Spark) that hold a row of ``rows``: its optimized plan with each join that would pad
    ``rows``' side with nulls, or keep the other side's rows where they do not match it, made one
    that keeps only the rows matching it (:data:`_HOLDING`: a left outer join with ``rows`` on its
    right an inner join, a left anti join a left semi join). The other joins keep their types: a
    row of ``rows`` on a side they keep is in every row it makes. ``rows``' leaf is the one with its
    columns (the optimizer keeps their ids). Where no join needs changing (inner joins alone), or
    the optimizer dropped the leaf (a left join none of whose right side's columns the query
    reads), ``result`` as it is.

    A filter above such a join that reads the side it padded (``WHERE o_orderkey IS NULL``: an
    anti-join written as an outer join) tells the padded rows from the matched ones: the rows a
    change of ``rows`` makes or ends are the other side's rows it matches, padded before and
    matched after or the reverse, which the filter passes in one form only. Its conjuncts that
    read that side (or a column computed from it) are dropped (:func:`_unfiltered`): the rows kept
    are every row the change matches, a superset of those whose groups it moves (recomputing a
    group it did not move changes nothing)."""
    ids = {a.exprId().id() for a in scala_items(rows._jdf.queryExecution().analyzed().output())}
    nodes = Catalyst(result.sparkSession.sparkContext._jvm)
    padded: set[int] = set()  # the output of the sides the changed joins padded

    def holds(node) -> bool:
        """Whether ``rows``' leaf (the one with its columns) is under ``node``."""
        children = scala_items(node.children())
        if children:
            return any(map(holds, children))
        return any(a.exprId().id() in ids for a in scala_items(node.output()))

    def holding(join) -> str | None:
        if not holds(join):
            return None
        right = holds(join.right())
        kind = _HOLDING.get(join.joinType().toString(), (None, None))[right]
        if kind == "Inner":
            padded.update(a.exprId().id() for a in scala_items((join.right() if right else join.left()).output()))
        return kind

    plan = nodes.rejoined(result._jdf.queryExecution().optimizedPlan(), holding)
    if plan is None:
        return result
    return nodes.frame(result, _unfiltered(nodes, plan, padded) if padded else plan)


def _unfiltered(nodes: Catalyst, plan, padded: set[int]):
    """``plan`` without the conjuncts of its filters that read an attribute of ids ``padded``, or
    one a projection computes from them (a filter left with none is dropped)."""
    tainted = set(padded)

    def rebuilt(node):
        children = scala_items(node.children())
        below = [rebuilt(child) for child in children]
        if any(new is not old for new, old in zip(below, children)):
            node = node.withNewChildren(nodes.seq(below))
        name = node.nodeName()
        if name == "Project":
            tainted.update(named.exprId().id() for named in scala_items(node.projectList())
                           if named.nodeName() == "Alias" and references(named.child()) & tainted)
        elif name == "Filter":
            every = conjuncts(node.condition())
            kept = [c for c in every if not references(c) & tainted]
            if len(kept) < len(every):
                return nodes.logical.Filter(reduce(nodes.and_, kept), node.child()) if kept else node.child()
        return node

    return rebuilt(plan)
