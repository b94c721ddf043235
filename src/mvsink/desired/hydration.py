"""A view's hydration as it runs: when it started, how far Spark has got, what it took.

A hydration reads a view whole: its contents at one time and the whole table on the persisted
side (the first step of a replica, or the step after a lost read-back). It runs in the stepping
thread from :meth:`Hydration.start` to :meth:`Hydration.finish` (or :meth:`Hydration.abort` when
the step fails); the job log says when it starts and ends, with the updates it left to write
(the view's rows, into an empty table) and seconds.

Invariants: :attr:`Hydration.started_at` is set exactly while a hydration runs; ``last_rows``
and ``last_seconds`` describe the last finished one. The Spark jobs the hydration
starts carry a job tag of their own, :attr:`Hydration.tag` (a thread-local property of the stepping thread,
removed when the hydration ends), so :meth:`Hydration.tasks` can count their tasks from another
thread (a metrics scrape, a status) through Spark's status tracker, without touching the step.
"""

from __future__ import annotations

import logging
import time
import uuid

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class Hydration:
    def __init__(self, spark: SparkSession, view_id: str):
        self.spark = spark
        self.view_id = view_id
        #: The job tag of the running hydration's Spark jobs (one per hydration).
        self.tag = ""
        #: Wall clock (seconds since the epoch) of the running hydration's start; None when none runs.
        self.started_at: float | None = None
        #: The rows and seconds of the last finished hydration.
        self.last_rows = 0
        self.last_seconds = 0.0
        self._started = 0.0

    @property
    def running(self) -> bool:
        return self.started_at is not None

    def elapsed(self) -> float:
        """Seconds the running hydration has taken so far (0 when none runs)."""
        return time.monotonic() - self._started if self.running else 0.0

    def start(self, at_time: int, versions: dict[str, int]) -> None:
        """A hydration at ``at_time`` begins in this thread (replacing one that did not finish)."""
        if self.running:
            self._end()
        self._started, self.started_at = time.monotonic(), time.time()
        self.tag = f"mvsink-hydration-{self.view_id}-{uuid.uuid4().hex[:12]}"
        self.spark.sparkContext.addJobTag(self.tag)
        log.info("view %s: hydration started at time %d = %s", self.view_id, at_time, versions)

    def finish(self, rows: int) -> None:
        """The running hydration ended, leaving ``rows`` updates to write (the correction buffer:
        the view's rows when the table was empty, the drift when it held the view already)."""
        seconds = self.elapsed()
        self._end()
        self.last_rows, self.last_seconds = rows, seconds
        log.info("view %s: hydration done: %d updates to write in %.1fs", self.view_id, rows, seconds)

    def abort(self, exc: BaseException) -> None:
        """The step running the hydration failed; the next step hydrates again."""
        seconds = self.elapsed()
        self._end()
        log.warning("view %s: hydration failed after %.1fs: %s", self.view_id, seconds, exc)

    def _end(self) -> None:
        self.spark.sparkContext.removeJobTag(self.tag)
        self.started_at = None

    def tasks(self) -> tuple[int, int] | None:
        """Tasks done and tasks in all of the running hydration's Spark jobs started so far
        (later jobs add to the total); None when no hydration runs."""
        if not self.running:
            return None
        sc = self.spark.sparkContext
        tracker = sc.statusTracker()
        done = total = 0
        for job_id in sc._jsc.sc().statusTracker().getJobIdsForTag(self.tag):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done, total
