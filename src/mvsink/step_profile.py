"""Where one step's time went: wall seconds and Spark jobs per phase.

A step runs its phases one after another on one thread, so the phases' seconds add up to at most
the step's (the rest is bookkeeping between them). A phase may be entered several times in a step
(a repair time reads the input twice); its seconds and jobs accumulate.

The step's Spark jobs carry one job tag (``SparkContext.addJobTag``, set by :meth:`StepProfile.tagged`
around the whole step), beside the tag a :class:`~mvsink.step_loop.StepLoop` gives its thread's
jobs (and a streaming query's job group), so stopping either still cancels the step's jobs. At the
step's end each tagged job goes to the phase that was running when Spark took it (its submission
time, the driver's clock, as a phase's start and end are): a phase waits for the jobs it starts,
so a job is submitted within the phase that ran it; where two phases meet within one millisecond
(the clock Spark keeps), the later one takes it. Entering a phase costs no call into the JVM: a
step that runs no job (a view caught up, polled) makes four in all.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from contextlib import contextmanager

from py4j.protocol import Py4JJavaError

#: The phases of a step, in the order they run (see :mod:`mvsink.sink`).
PHASES = ("readback", "mint", "input", "correction", "key_check", "staging", "commit", "upkeep")

_profiles = itertools.count()


class StepProfile:
    def __init__(self, spark):
        self._sc = spark.sparkContext
        self._tag = f"mvsink-step-{next(_profiles)}"
        self.seconds: dict[str, float] = {}
        self.spark_jobs: dict[str, int] = {}
        #: Each phase entered: (name, first and last millisecond of the wall clock it ran in).
        self._spans: list[tuple[str, int, int]] = []

    @contextmanager
    def tagged(self):
        """Tag the Spark jobs of the block (the step) as this profile's."""
        self._sc.addJobTag(self._tag)
        try:
            yield self
        finally:
            self._sc.removeJobTag(self._tag)

    @contextmanager
    def phase(self, name: str):
        """Time the block as phase ``name``; :meth:`count_jobs` counts the Spark jobs it ran."""
        started, wall = time.monotonic(), time.time()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - started
            self._spans.append((name, math.floor(wall * 1000), math.ceil(time.time() * 1000)))

    def count_jobs(self) -> None:
        """Count each phase's Spark jobs (at the step's end, within :meth:`tagged`: the status
        store learns of a job from the listener bus, a moment after the job started)."""
        self.spark_jobs = dict.fromkeys(self.seconds, 0)
        tagged = _status_tracker(self._sc).getJobIdsForTag(self._tag)
        job_ids = [tagged[i] for i in range(len(tagged))]
        if not job_ids:
            return
        store = self._sc._jsc.sc().statusStore()
        for job_id in job_ids:
            phase = self._phase_at(_submitted_millis(store, job_id))
            if phase is not None:
                self.spark_jobs[phase] += 1

    def _phase_at(self, millis: float) -> str | None:
        """The phase running at ``millis``: the last entered of those running then, else the last
        that had ended (a job between two phases, or of no known time, is its predecessor's)."""
        running = [(start, i, name) for i, (name, start, end) in enumerate(self._spans) if start <= millis <= end]
        if running:
            return max(running)[2]
        ended = [(end, i, name) for i, (name, _, end) in enumerate(self._spans) if end < millis]
        return max(ended)[2] if ended else None


@functools.lru_cache(maxsize=4)
def _status_tracker(sc):
    """The JVM's status tracker of ``sc`` (one py4j object, not three calls per step)."""
    return sc._jsc.sc().statusTracker()


def _submitted_millis(store, job_id: int) -> float:
    """When Spark took job ``job_id`` (ms), or infinity where that is not known: a job of no
    submission time, or one the status store dropped between listing the tag's jobs and reading
    this one (it keeps the last ``spark.ui.retainedJobs``, and a step may run more)."""
    try:
        submitted = store.job(job_id).submissionTime()
    except Py4JJavaError as error:
        if "NoSuchElementException" not in str(error.java_exception):
            raise
        return math.inf
    return submitted.get().getTime() if submitted.isDefined() else math.inf
