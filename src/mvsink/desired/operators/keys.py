"""The keys a step's change touches, and an input read only where they lie.

An operator whose rows of one key depend only on its inputs' rows of that key (:mod:`.by_key`)
recomputes the touched keys' rows; a join's term reads the other side only where the change's
join keys lie (:mod:`.inner_join`). Both start from :class:`TouchedKeys`: the distinct values of
some key expressions over some changes' rows (one job that collects them; a restriction holds them
in Spark too where they are more than :data:`LOCAL_MOST`). Then:

* :meth:`TouchedKeys.restrict` keeps an input's rows whose keys are among them (a semi join by
  null-safe equality: a null key is a key), exactly;
* where they are few (:data:`PRUNE_MOST`), each key expression is also filtered by the ranges
  its values fall in (at most :data:`MOST_RANGES`, split at the widest gaps between them; ``OR IS
  NULL`` where a key is null): Spark pushes such a filter down to the sources' scans where the
  expression is a source's column, and Delta skips the files whose statistics lie outside every
  range (Delta reads an ``IN`` as the one range from its least value to its greatest: deleted old
  keys and inserted new ones would span every file). Only for types whose values are exact as
  text (integers, strings, dates, decimals); a filter never drops a row the restriction keeps.
"""

from __future__ import annotations

from mvsink.desired.operators.base import Step
from mvsink.desired.row_wise import conjuncts, references, scala_items

#: The most distinct keys a change may touch for its inputs to be filtered by their values.
PRUNE_MOST = 100_000
#: The most keys held in a local relation (collected: no job to hold them; of the types below,
#: which Python gives back to Spark as they were), else held in Spark.
LOCAL_MOST = 1000
#: The most ranges one key expression is filtered by.
MOST_RANGES = 16
#: Key types whose values are filtered by (their text cast back to the type is the value).
_EXACT_AS_TEXT = frozenset({"byte", "short", "integer", "long", "string", "date", "decimal"})


class TouchedKeys:
    """The distinct values of key expressions over changes' rows (``_k0``, ``_k1``...)."""

    def __init__(self, step: Step, parts: list[tuple[object, list]]):
        catalyst = self.catalyst = step.catalyst
        projected = [catalyst.project([catalyst.alias(e, f"_k{i}") for i, e in enumerate(exprs)], plan)
                     for plan, exprs in parts]
        keys = catalyst.frame(catalyst.distinct(catalyst.union(projected)))
        values = keys.limit(PRUNE_MOST + 1).toArrow()
        #: Per key column, its values and whether one is null (None: too many to filter by).
        self.columns: list[tuple[list, bool]] | None = None
        if values.num_rows <= PRUNE_MOST:
            self.columns = [([v for v in column.to_pylist() if v is not None], column.null_count > 0)
                            for column in values.columns]
        self._keys, self._values, self._held = keys, values, None

    def _held_plan(self):
        """The keys held, on first use: a local relation where they are few and of exact types (no
        more job), else in Spark."""
        if self._held is None:
            keys, exact = self._keys, all(f.dataType.typeName() in _EXACT_AS_TEXT for f in self._keys.schema.fields)
            if self._values.num_rows <= LOCAL_MOST and exact:
                keys = self.catalyst.session.createDataFrame(self._values.to_pylist(), keys.schema)
            else:
                keys = keys.localCheckpoint(eager=True)
            self._held = self.catalyst.analyzed(keys)
        return self._held

    def restrict(self, plan, exprs: list):
        """``plan``'s rows whose ``exprs`` are one of the keys (null-safe), filtered by value too."""
        keys = self._held_plan().newInstance()  # attributes of its own each time it is read
        catalyst = self.catalyst
        condition = catalyst.all_of([catalyst.null_safe_equal(e, k) for e, k in zip(exprs, scala_items(keys.output()))])
        return catalyst.semi_join(self.filtered(plan, exprs), keys, condition)

    def filtered(self, plan, exprs: list):
        """``plan`` filtered by the key values where they are few (see the module doc), else as it is."""
        if self.columns is None:
            return plan
        catalyst = self.catalyst
        if not any(values or nulls for values, nulls in self.columns):  # no key: no row
            return catalyst.nothing(plan)
        conditions = [catalyst.within(e, _ranges(values), nulls) for e, (values, nulls) in zip(exprs, self.columns)
                      if e.dataType().typeName() in _EXACT_AS_TEXT]
        return catalyst.filter(catalyst.all_of(conditions), plan) if conditions else plan

    @staticmethod
    def pruned(step: Step, plan, exprs: list, parts: list[tuple[object, list]]):
        """``plan`` read only where ``exprs`` meet the keys of ``parts`` (no job where there are no keys)."""
        if not exprs:
            return plan
        return TouchedKeys(step, parts).filtered(plan, exprs)


def _ranges(values: list) -> list[tuple]:
    """Sorted ``values`` as at most :data:`MOST_RANGES` ranges ``(least, greatest)`` covering them,
    split at the widest gaps (numbers and dates), else into runs of equal counts (strings)."""
    values = sorted(set(values))
    if len(values) <= MOST_RANGES:
        return [(v, v) for v in values]
    if isinstance(values[0], str):
        size = -(-len(values) // MOST_RANGES)
        return [(values[i], values[min(i + size, len(values)) - 1]) for i in range(0, len(values), size)]
    measure = (lambda v: v.toordinal()) if hasattr(values[0], "toordinal") else (lambda v: v)
    gaps = sorted(range(1, len(values)), key=lambda i: measure(values[i]) - measure(values[i - 1]))[-(MOST_RANGES - 1):]
    starts = [0] + sorted(gaps)
    return [(values[a], values[b - 1]) for a, b in zip(starts, starts[1:] + [len(values)])]


def equi_keys(join) -> tuple[list, list]:
    """A join's equalities (``=``, ``<=>``) of an expression of each side, as each side's
    expressions in pairs (empty lists where it has none)."""
    left_ids = {a.exprId().id() for a in scala_items(join.left().output())}
    right_ids = {a.exprId().id() for a in scala_items(join.right().output())}
    lefts, rights = [], []
    condition = join.condition()
    for conjunct in conjuncts(condition.get()) if condition.isDefined() else []:
        if conjunct.nodeName() not in ("EqualTo", "EqualNullSafe"):
            continue
        a, b = conjunct.left(), conjunct.right()
        ra, rb = references(a), references(b)
        if not ra or not rb:
            continue
        if ra <= left_ids and rb <= right_ids:
            lefts.append(a), rights.append(b)
        elif ra <= right_ids and rb <= left_ids:
            lefts.append(b), rights.append(a)
    return lefts, rights
