"""Plans: the updates a view's next commit at a replica would write, answered over the protocol.

Before promoting a read-only replica an operator asks for its plan: the commit it would make
first if it were allowed to write now, against the live table (:meth:`MaterializedView.plan`: its
correction buffer below the next upper it would mint, plus the undos of foreign commits it would
repair). For a changed definition that is the whole difference between the old view and the new.

Invariants: a plan is answered once, by a thread of its own (a plan may wait for a running step
and runs Spark jobs; the command stream goes on meanwhile); the counts are of the whole plan, the
rows at most ``limit`` of it, sorted by time, then row, then diff (the same rows every time); a
result over ``max_result_bytes`` (Arrow size) is an error answer, as is an unknown or
not yet hydrated view, never a crash of the replica. Nothing is written.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from pyspark.sql import functions as F

from mvsink.log_context import about_view
from mvsink.replica.peek import PeekError, collect_arrow
from mvsink.replica.protocol import PEEK_ERROR, PEEK_ROWS, Plan, PlanResponse, arrow_text
from mvsink.sink import MaterializedView, NotCaughtUp
from mvsink.updates import DIFF, ERROR, RESERVED, TIME

log = logging.getLogger(__name__)


def answer_plan(mv: MaterializedView, plan: Plan, send: Callable[[PlanResponse], None]) -> None:
    """Compute ``plan`` in a thread of its own and ``send`` its one answer."""
    def answer() -> None:
        with about_view(mv.view.view_id):
            send(run_plan(mv, plan))

    threading.Thread(target=answer, name=f"mvsink-plan-{plan.uuid}", daemon=True).start()


def run_plan(mv: MaterializedView, plan: Plan) -> PlanResponse:
    """The answer to ``plan`` for the view ``mv``."""
    if plan.limit is not None and (isinstance(plan.limit, bool) or plan.limit < 0):
        return PlanResponse(plan.uuid, PEEK_ERROR, error=f"bad plan request: limit {plan.limit} < 0")
    try:
        desc, updates = mv.plan()
        counts = updates.agg(
            F.count(F.lit(1)).alias("updates"),
            F.coalesce(F.sum(F.when(F.col(DIFF) > 0, F.col(DIFF))), F.lit(0)).alias("added"),
            F.coalesce(F.sum(F.when(F.col(DIFF) < 0, -F.col(DIFF))), F.lit(0)).alias("removed"),
        ).first()
        user = [c for c in updates.columns if c not in RESERVED]
        order = [TIME, *user, ERROR, DIFF]
        rows = updates.select(*[F.col(f"`{c}`") for c in user], ERROR, TIME, DIFF)
        rows = rows.orderBy(*[F.col(f"`{c}`") for c in order])
        if plan.limit is not None:
            rows = rows.limit(plan.limit)
        table = collect_arrow(rows, plan.max_result_bytes, f"the plan of view {plan.view_id!r}")
    except (NotCaughtUp, PeekError) as exc:
        return PlanResponse(plan.uuid, PEEK_ERROR, error=str(exc))
    except Exception as exc:
        log.exception("plan %s of view %s failed", plan.uuid, plan.view_id)
        return PlanResponse(plan.uuid, PEEK_ERROR, error=f"plan failed: {exc}")
    log.info("plan of view %s: [%d, %d) writes %d updates (+%d, -%d rows)", plan.view_id, desc.lower,
             desc.upper, counts.updates, counts.added, counts.removed)
    return PlanResponse(plan.uuid, PEEK_ROWS, lower=desc.lower, upper=desc.upper, updates=counts.updates,
                        added=counts.added, removed=counts.removed, arrow=arrow_text(table))
