"""A query view's refresh policy, and why a query cannot be maintained from its sources' changes.

``auto`` (the default) maintains the query from its sources' changes where its shape allows
(row-wise, linear aggregate, inner join, union all, per-group aggregate, key join:
:mod:`mvsink.desired.snapshot`), while that costs less than evaluating it in full
(:class:`AutoRefresh`), and evaluates it in full otherwise; ``incremental`` maintains it always
(full evaluation only where the sources' changes cannot be read) and refuses at start a query that
cannot be maintained, naming the first operator of its plan that none of those strategies maintains
(:func:`unmaintained_operator`); ``full`` evaluates every query in full.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import DataFrame

from mvsink.desired.change_size import ChangeSize
from mvsink.desired.join import INNER_JOINS
from mvsink.desired.row_wise import plan_reads_subqueries

#: Plan nodes some strategy maintains (an ``Aggregate`` only at or near the top; a ``Union``: ``UNION ALL``).
_MAINTAINED = frozenset({"Project", "Filter", "Join", "Union", "Aggregate"})

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fallback:
    """Why a step of a query view evaluated the query in full: ``kind`` one of ``policy`` (refresh
    full), ``query`` (no strategy maintains it), ``change share`` and ``cost`` (``auto``'s choice),
    ``unreadable`` (the sources' changes cannot be read), ``failed`` (the maintained step raised,
    under any policy: :meth:`~mvsink.desired.snapshot.SnapshotDesired.changes`); ``why`` in words."""

    kind: str
    why: str

    def __str__(self) -> str:
        return self.why


class AutoRefresh:
    """Under ``auto``, for a maintained query: whether a step evaluates it in full instead, from
    what each way cost per time when last taken (seconds of the step's input, for each time it
    covers; a full evaluation that had to evaluate the time before as well counts it too).

    Before a step, the size of its change decides: a change whose share of the sources' bytes per
    time (:mod:`mvsink.desired.change_size`) passes the view's :attr:`share_limit`, of sources of
    at least :data:`SHARE_MIN_BYTES`, is evaluated in full at once, without paying for the
    maintained step first. The limit is where full evaluation became cheaper, measured
    (``benchmarks/bench_crossover.py``): for a query over several sources (:data:`JOIN_SHARE`: a
    join's change also reads the other sides where it joins them, more of them as it grows), and
    over one (:data:`ONE_SOURCE_SHARE`: a step reads the change, and for a per-group recompute its
    groups' rows). Otherwise the costs decide: the
    maintained strategy is taken until one of its steps costs more per time than a full
    evaluation (the last one measured, or before any, the view's hydration: the query evaluated
    whole and folded into the buffer, at least one evaluation) and more than :data:`FLOOR` (below
    it there is little to save, and a step's cost is mostly noise). Then full evaluation is taken
    while it stays cheaper, and the maintained strategy is tried again every :data:`RETRY` steps
    (the sources' changes may have become smaller). Either way the changes are exact: only the
    cost is chosen. (A row-wise query is not weighed: it reads its change, never more.)"""

    #: Steps evaluated in full between two tries of the maintained strategy.
    RETRY = 10
    #: Seconds per time a maintained step may take without being weighed against full evaluation.
    FLOOR = 5.0
    #: The change's share of the sources' bytes per time above which a step is evaluated in full,
    #: for a query over several sources and over one, where the sources hold at least
    #: :data:`SHARE_MIN_BYTES` (below, a full evaluation costs little, and a small table's share
    #: is mostly its files' fixed overhead).
    JOIN_SHARE = 0.05
    ONE_SOURCE_SHARE = 0.25
    SHARE_MIN_BYTES = 64 << 20

    def __init__(self, view_id: str, sources: int = 1):
        self.view_id = view_id
        #: The share above which this view's steps are evaluated in full (the query reads ``sources``).
        self.share_limit = self.JOIN_SHARE if sources > 1 else self.ONE_SOURCE_SHARE
        #: Seconds per time of the last maintained step and of the last full evaluation (or hydration).
        self.maintained: float | None = None
        self.full: float | None = None
        self._full_steps = 0

    def hydrated(self, seconds: float) -> None:
        """The view's hydration took ``seconds``: the full evaluation's cost until one is measured."""
        if self.full is None:
            self.full = seconds

    @property
    def _full_cheaper(self) -> bool:
        return (self.maintained is not None and self.full is not None
                and self.maintained > max(self.full, self.FLOOR))

    def full_instead(self, size: ChangeSize | None, times: int) -> Fallback | None:
        """Why the next step evaluates the query in full instead of maintaining it, given its
        change's size over ``times`` times (None: not known); None where it maintains it. A step
        taken in full by its costs is counted, for the retries."""
        share = size.share / max(1, times) if size is not None and size.sources >= self.SHARE_MIN_BYTES else 0.0
        if share > self.share_limit:
            return Fallback("change share", f"its change is {share:.1%} of its sources' bytes per time, above "
                                            f"auto's {self.share_limit:.0%}")
        if not self._full_cheaper:
            return None
        self._full_steps += 1
        if self._full_steps % self.RETRY == 0:
            return None
        return Fallback("cost", f"full evaluation was cheaper ({self.full:.2f}s per time, maintained "
                                f"{self.maintained:.2f}s)")

    def observed(self, full: bool, seconds: float, evaluations: int) -> None:
        """A step took ``seconds`` for ``evaluations`` times (full: evaluations of the query)."""
        cost = seconds / max(1, evaluations)
        before = self._full_cheaper
        if full:
            self.full = cost
        else:
            self.maintained = cost
        after = self._full_cheaper
        if before != after:
            log.info("view %r: refresh auto: %s (%.2fs per time maintained, %.2fs evaluated in full)", self.view_id,
                     "evaluating in full, cheaper now" if after else "maintaining from the changes, cheaper now",
                     self.maintained, self.full)


def unmaintained_operator(result: DataFrame) -> str:
    """The first part of ``result``'s optimized plan (a query no strategy maintains) that stops
    it, for a user: an operator by its Spark name, an outer join by its type, or what else."""
    plan = result._jdf.queryExecution().optimizedPlan()
    if not plan.deterministic():
        return "a non-deterministic expression"
    if plan_reads_subqueries(result, plan):
        return "a subquery"
    pending, joins, aggregates, scans = [plan], 0, 0, 0
    while pending:
        node = pending.pop()
        name = node.nodeName()
        if name == "Join" and node.joinType().toString() not in INNER_JOINS:
            return (f"a {node.joinType().toString()} Join with no key that every join equates, nor under an "
                    "aggregate grouped by columns of a side no outer join pads")
        if name not in _MAINTAINED:
            if not node.children().isEmpty():
                return name
            scans += 1
            continue
        joins, aggregates = joins + (name in ("Join", "Union")), aggregates + (name == "Aggregate")
        children = node.children()
        pending += [children.apply(i) for i in range(children.size())]
    if aggregates:
        return ("an Aggregate that is neither count/sum/avg of integers or decimals grouped by columns nor "
                "order-free aggregates of one source, a join or a key join grouped by columns of their sources")
    return "a source read twice by one read of the text (a CTE read twice)" if joins else f"the plan {plan.nodeName()} over {scans} scans"
