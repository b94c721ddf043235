"""Where one step's time went: wall seconds and Spark jobs per phase.

A step runs its phases one after another on one thread, so the phases' seconds add up to at most
the step's (the rest is bookkeeping between them). A phase may be entered several times in a step
(a repair time reads the input twice); its seconds and jobs accumulate. Spark jobs are counted by
a job tag per phase (``SparkContext.addJobTag``), beside the tag a :class:`~mvsink.step_loop.StepLoop`
gives its thread's jobs (and a streaming query's job group), so stopping either still cancels the
step's jobs.
"""

from __future__ import annotations

import itertools
import time
from contextlib import contextmanager

#: The phases of a step, in the order they run (see :mod:`mvsink.sink`).
PHASES = ("readback", "mint", "input", "correction", "key_check", "staging", "commit", "upkeep")

_profiles = itertools.count()


class StepProfile:
    def __init__(self, spark):
        self._sc = spark.sparkContext
        self._tag = f"mvsink-step-{next(_profiles)}"
        self.seconds: dict[str, float] = {}
        self.spark_jobs: dict[str, int] = {}

    @contextmanager
    def phase(self, name: str):
        """Time the block as phase ``name`` and count the Spark jobs it runs."""
        tag = f"{self._tag}-{name}"
        self._sc.addJobTag(tag)
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - started
            self._sc.removeJobTag(tag)

    def count_jobs(self) -> None:
        """Count each phase's Spark jobs (at the step's end: the status store learns of a job
        from the listener bus, a moment after the job started)."""
        tracker = self._sc._jsc.sc().statusTracker()
        self.spark_jobs = {name: len(tracker.getJobIdsForTag(f"{self._tag}-{name}")) for name in self.seconds}
