"""A view's steps on a timer, in a thread of the driver: what ``MaterializedView.start_stream`` runs.

A step reads its input itself at pinned source versions, so a streaming micro-batch would only be
a clock; each one also costs Spark's planning, its offset and commit logs and a callback into
Python (about 35 ms of CPU, most of an idle replica's work at a 0.5 s trigger). A
:class:`StepLoop` is that clock without them: one thread that calls the step every
``trigger_seconds`` (the next start is the last one plus the interval; a step that overran is
followed at once, as a processing-time trigger does).

Invariants: at most one step runs at a time, on the loop's thread; :meth:`StepLoop.stop` lets a
running step end (it never starts another), and only after ``timeout_seconds`` cancels that step's
Spark jobs (tagged with the loop's tag), which a step survives without loss (see
:meth:`mvsink.sink.MaterializedView.step`). An exception out of the step ends the loop and is kept
(:meth:`StepLoop.exception`); the loop's attributes mirror a ``StreamingQuery``'s where they meet
(``id``, ``name``, ``isActive``, ``exception()``, ``stop()``, ``awaitTermination()``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from typing import Callable

from mvsink.log_context import about_view

log = logging.getLogger(__name__)


class StepLoop:
    def __init__(self, spark, name: str, trigger_seconds: float, run_step: Callable[[int], None],
                 view_id: str | None = None):
        """Start calling ``run_step(n)`` (``n`` counts the steps from 0) every ``trigger_seconds``;
        the loop's log lines, its steps' included, name ``view_id`` (:mod:`mvsink.log_context`)."""
        if trigger_seconds <= 0:
            raise ValueError(f"trigger_seconds must be positive, not {trigger_seconds}")
        self.id = uuid.uuid4()
        self.name = name
        self._sc = spark.sparkContext
        self._tag = f"mvsink-loop-{self.id}"
        self._trigger = trigger_seconds
        self._run_step = run_step
        self._view_id = view_id
        self._stopping = threading.Event()
        self._exception: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def isActive(self) -> bool:  # noqa: N802 (a StreamingQuery's name)
        return self._thread.is_alive()

    def exception(self) -> BaseException | None:
        """The exception that ended the loop, if one did."""
        return self._exception

    def awaitTermination(self, timeout: float | None = None) -> bool:  # noqa: N802
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout_seconds: float = 60.0) -> None:
        """Stop between two steps: wait up to ``timeout_seconds`` for a running step to end, then
        cancel its Spark jobs and wait for it to give up."""
        self._stopping.set()
        if threading.current_thread() is self._thread:
            return  # asked from within a step: no further step starts
        self._thread.join(timeout_seconds)
        if self._thread.is_alive():
            log.warning("%s: the step still runs after %.0fs; cancelling its Spark jobs", self.name, timeout_seconds)
            self._sc.cancelJobsWithTag(self._tag)
            self._thread.join()

    def _run(self) -> None:
        with about_view(self._view_id) if self._view_id is not None else contextlib.nullcontext():
            self._steps()

    def _steps(self) -> None:
        self._sc.addJobTag(self._tag)  # this thread's jobs, for a stop that cannot wait
        next_start, n = time.monotonic(), 0
        while not self._stopping.is_set():
            try:
                self._run_step(n)
            except BaseException as exc:
                if not self._stopping.is_set():
                    self._exception = exc
                    log.error("%s ended: step %d failed: %s", self.name, n, exc)
                return
            n += 1
            next_start = max(next_start + self._trigger, time.monotonic())
            self._stopping.wait(next_start - time.monotonic())
