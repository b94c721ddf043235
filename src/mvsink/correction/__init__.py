"""The correction buffer: `desired - persisted`, consolidated, kept partitioned in Spark.

It holds the updates a replica would have to commit for the target table to equal the view. In
steady state it is nearly empty: desired updates enter it, and the same updates leave it when the
commit that wrote them (this replica's or another's) is read back from the table. Drift of any
kind (a lost race, a crash, a foreign write) shows up here as a non-empty difference and is
written by the next batch.

Invariants:

* Every update has a time at or after :attr:`since` (the persist frontier last applied): times
  before it are advanced to it, which keeps the contents at every time >= since unchanged.
* Consolidated: no two updates with the same row and time, no zero diff.
* Never on the driver: the contents live in Spark's block manager (a local checkpoint, which also
  cuts the lineage each step); only counts reach the driver. One exception, from a hydration into
  an empty table until the next fold: the buffer may be a stored snapshot read again where used
  (:meth:`hold`); until its keys are checked (:meth:`keys_checked`), it is not known to be
  consolidated and its size is None.
* An empty buffer given updates that are already consolidated, held and at or after the since
  (a step's input changes, :class:`mvsink.desired.changes.Changes`) takes them as they are (:meth:`hold`):
  the steady state's fold runs no Spark job.
* :attr:`size` is the number of updates when known (a fold counts them in the job that
  materializes them); folding nothing at an unchanged since runs no Spark job.
"""

from __future__ import annotations

import logging
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink.updates import TIME, advance_times, consolidate

log = logging.getLogger(__name__)

#: Ask the JVM to collect garbage every this many steps, so that the ContextCleaner frees the
#: blocks of checkpoints no longer referenced.
_GC_EVERY = 50


#: What Spark says when a job needs a local checkpoint's block that died with its executor.
_LOST_BLOCK = ("Checkpoint block", "BlockNotFoundException", "ExecutorLostFailure",
               "executor that originally checkpointed")


def state_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a Spark job failing for a local checkpoint's block lost with its
    executor: the held state (buffer, held changes) is gone and cannot be recomputed (its lineage
    was cut), so the replica must drop it and hydrate again."""
    text = str(exc)
    return any(marker in text for marker in _LOST_BLOCK)


def checkpointed(frame: DataFrame) -> tuple[DataFrame, int]:
    """``frame`` kept in Spark's block manager (a local checkpoint, its lineage cut) and its row
    count, in one Spark job: the count of the checkpoint's own rows, where ``DataFrame.count``
    would add an aggregation and, under adaptive execution, a job of its own."""
    kept = frame.localCheckpoint(eager=False)
    return kept, kept._jdf.javaRDD().count()


def held_observing(frame: DataFrame, name: str, *metrics: Column, keep: list[str] | None = None,
                   executed: list[DataFrame] | None = None) -> tuple[DataFrame, list]:
    """``frame`` (its columns ``keep``, default all) kept in Spark's block manager, and the
    values of ``metrics`` (aggregates over its rows) observed by the same Spark job. The DataFrame
    the job ran is appended to ``executed`` if given (its query execution holds the plan it ran)."""
    observed = frame.observe(name, *metrics).select(*(keep or frame.columns))
    kept = observed.localCheckpoint(eager=True)
    if executed is not None:
        executed.append(observed)
    # The metrics of the action that just ran, read from its query execution (not waited for).
    reported = observed._jdf.queryExecution().observedMetrics()
    if not reported.contains(name):
        raise RuntimeError(f"Spark reported no observed metrics {name!r}")
    row = reported.get(name).get()
    return kept, [row.get(i) for i in range(len(metrics))]


class CorrectionBuffer:
    def __init__(self, spark: SparkSession, schema: T.StructType):
        self.spark = spark
        self.schema = schema
        self.since = 0
        self.updates: DataFrame = spark.createDataFrame([], schema)
        self.size: int | None = 0
        self._steps = 0

    def apply(self, changes: list[DataFrame], since: int) -> None:
        """Fold ``changes`` (updates in the buffer's schema) in and advance times to ``since``."""
        if not changes and since <= self.since:
            return  # consolidated, and no time below since: nothing would change
        self.since = max(self.since, since)
        frames = [self.updates] + [c.select(*self.schema.names) for c in changes]
        merged = consolidate(advance_times(reduce(DataFrame.unionByName, frames), self.since))
        self._replace(*checkpointed(merged))

    def hold(self, updates: DataFrame, size: int | None, since: int) -> None:
        """Take ``updates`` (``size`` of them, consolidated, times at or after ``since``;
        materialized or a stored snapshot) as the whole buffer, instead of an empty one: a step's
        input changes (held), or (``size`` None) a hydration's snapshot into an empty table, not
        yet known to be consolidated: :meth:`keys_checked` says whether it is."""
        assert self.size == 0, "only an empty buffer is replaced"
        self.since = max(self.since, since)
        self._replace(updates, size)

    def keys_checked(self, size: int | None) -> None:
        """What the key check found of a held snapshot (:meth:`hold` with no size): every key once,
        with diff 1, in ``size`` updates, so consolidated; or (None) not: consolidate it."""
        if size is None:
            self._replace(*checkpointed(consolidate(self.updates)))
        else:
            self.size = size

    def _replace(self, updates: DataFrame, size: int) -> None:
        self.updates, self.size = updates, size
        self._steps += 1
        if self._steps % _GC_EVERY == 0:
            self.spark.sparkContext._jvm.System.gc()

    def drop_written(self, upper: int, written: int | None) -> None:
        """The buffer after the table took its updates below ``upper`` as they are (a won append
        that the read-back adopted): what is left is at ``upper`` or later, untouched.
        ``written``: how many updates that was, if exactly the buffer's (None: unknown)."""
        self.since = max(self.since, upper)
        self.updates = self.updates.where(F.col(TIME) >= F.lit(upper))
        self.size = None if self.size is None or written is None else self.size - written

    def reset(self) -> None:
        """Empty the buffer, for a rehydration from scratch."""
        self.updates = self.spark.createDataFrame([], self.schema)
        self.since = 0
        self.size = 0

    def count(self) -> int:
        if self.size is None:
            self.size = self.updates.count()
        return self.size
