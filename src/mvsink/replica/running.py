"""One view as it runs at a replica: its sink state, its step loop, its since.

A :class:`RunningView` owns a :class:`~mvsink.sink.MaterializedView` (the correction buffer and
the rest of the sink's state) and the :class:`~mvsink.step_loop.StepLoop` that steps it. The loop
can be stopped and started again (a new trigger interval) without losing that state: nothing is
re-hydrated. Compaction requested with :meth:`allow_compaction` runs at the start of a step, in
the loop's thread, so it never overlaps this replica's own append; it only runs once writes are
allowed (a read-only replica writes nothing) and only ever moves the since forward.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from mvsink.append.compact import compact
from mvsink.sink import MaterializedView

log = logging.getLogger(__name__)


class RunningView:
    def __init__(self, spec: dict, view: MaterializedView, on_progress: Callable[["RunningView"], None]):
        self.spec = spec
        self.view = view
        self.view_id = view.view.view_id
        self.on_progress = on_progress
        self.loop = None
        #: The since this replica was allowed to compact to (at least as_of).
        self.since = view.view.as_of
        self._compact_to: int | None = None
        self._lock = threading.Lock()

    @property
    def scheduled(self) -> bool:
        return self.loop is not None

    def schedule(self, trigger_seconds: float) -> None:
        if self.loop is None:
            self.loop = self.view.start_stream(trigger_seconds, before_step=self._before_step,
                                                after_step=lambda: self.on_progress(self))
            log.info("view %s scheduled (loop %s, every %.1fs)", self.view_id, self.loop.id,
                     trigger_seconds)

    def set_trigger(self, trigger_seconds: float) -> None:
        """Step at a new interval: stop the loop between steps and start it again."""
        if self.loop is not None:
            self.view.stop_stream(self.loop)
            self.loop = None
            self.schedule(trigger_seconds)

    def stop(self) -> None:
        if self.loop is not None:
            self.view.stop_stream(self.loop)
            log.info("view %s stopped", self.view_id)

    def failure(self) -> str | None:
        """Why the view's step loop ended, if it did (a step failed too often in a row)."""
        if self.loop is not None and not self.loop.isActive and self.loop.exception() is not None:
            return str(self.loop.exception())
        return None

    def allow_compaction(self, frontier: int) -> None:
        with self._lock:
            if frontier > self.since:
                self.since = frontier
                self._compact_to = frontier

    def _before_step(self) -> None:
        with self._lock:
            target = self._compact_to
        if target is None or self.view.read_only:
            return
        try:
            result = compact(self.view.spark, self.view.shard, self.view.schema, target)
        except Exception:
            log.exception("compaction of view %s to %d failed; retrying at the next step",
                          self.view_id, target)
            return
        log.info("view %s compacted to since %d: %s", self.view_id, target, result)
        with self._lock:
            if self._compact_to == target:
                self._compact_to = None

    def status(self) -> dict:
        hydration = self.view.hydration
        return {
            # The frontier is set as the hydration's step begins; hydrated only once it finished.
            "hydrated": self.view.frontier() is not None and not hydration.running,
            "hydrating": hydration.running,
            "hydration_started_at": hydration.started_at,
            "hydration_seconds": hydration.elapsed() if hydration.running else hydration.last_seconds,
            "hydration_tasks": hydration.tasks(),
            "hydration_rows": hydration.last_rows,
            "frontier": self.view.frontier(),
            "since": self.since,
            "scheduled": self.scheduled,
            "loop_id": str(self.loop.id) if self.loop is not None else None,
            "hydrations": self.view.hydrations,
            "steps": self.view.steps,
            "read_only": self.view.read_only,
            "definition": self.view.definition,
            "fenced": self.view.fenced,
            "failed": self.failure(),
        }
