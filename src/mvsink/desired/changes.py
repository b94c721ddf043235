"""What a step takes from the desired side: a range of times' updates, consolidated and held.

:class:`Changes` are consolidated and held in Spark with their count, all in one Spark job
(:func:`held_changes`), so that a step's fold into an empty correction buffer is no job at all;
a change feed whose files are small (:func:`feed_is_small`, from the source's log) is held in one
task, without a shuffle. A read that fails for good (:func:`unreadable`: the data is gone) is told
apart from one a retry may cure; when neither a range's changes nor its snapshots can be read,
the view stops with :class:`SourceChangesLost`, and with :class:`SourceSchemaChanged` when a
source's columns no longer fit the view's. Where asked, the Delta files the holding job scanned
are reported (:func:`delta_reads`), read off the plan it ran.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mvsink.correction import checkpointed, held_observing
from mvsink.desired.key_check import key_count_change
from mvsink.desired.row_wise import TABLE_SCAN, scala_items
from mvsink.table import change_data_bytes
from mvsink.updates import consolidate
from mvsink.view import ConfigError

#: A column of per-(key, time) sums of diffs, beside held updates.
NET = "_mv_net"
_OBSERVED = "mvsink_held_changes"

#: Error conditions of a change feed (or snapshot) read that no retry can cure.
_UNREADABLE = ("DELTA_MISSING_CHANGE_DATA", "FILE_NOT_EXIST", "FileNotFoundException", "DATA_TYPE_MISMATCH",
               "INCOMPATIBLE_SCHEMA_CHANGE", "DELTA_CHANGE_DATA_FEED", "PATH_NOT_FOUND")


@dataclass(frozen=True)
class Changes:
    """The input's updates at times `[lo, hi]`: consolidated, held in Spark (a local checkpoint:
    a read that fails shows when they are made, not later), and how many there are."""

    updates: DataFrame
    size: int
    lo: int
    #: Whether keys need checking: some key's row count changes at some time
    #: (:func:`mvsink.desired.key_check.key_count_change`) and the input cannot tell that no key violation
    #: starts or ends (as a row-wise view over a source with unique keys can); None for a view
    #: without key columns.
    key_counts_change: bool | None = None
    #: The key columns of the updates whose key's row count may change (a key may repeat; lazy
    #: over the held rows): every key whose count changes is there. Set wherever
    #: :attr:`key_counts_change` is true.
    touched: DataFrame | None = None
    #: The bounds of :attr:`touched`'s first key column: ``(low, high, has_null)``, where known
    #: (the key check reads only the table's files that can hold them); None: not known.
    touched_bounds: tuple | None = None
    #: How they were computed: ``change feed`` or ``snapshot difference`` (a change-feed view),
    #: ``row-wise``, ``linear aggregate``, ``per-group recompute``, ``per-key recompute``, ``inner
    #: join``, ``union all`` or ``full evaluation`` (a query view).
    strategy: str = ""
    #: The files of Delta tables the job that held them scanned (:func:`delta_reads`; the other
    #: sides of a join), where known.
    reads: tuple[SourceRead, ...] = ()


@dataclass(frozen=True)
class SourceRead:
    """A scan of a Delta table at one version: the files it read after data skipping, of all."""

    table: str
    version: int
    files: int
    total_files: int

    def __str__(self) -> str:
        return f"{self.table}@v{self.version} {self.files}/{self.total_files} files"


def delta_file_indexes(frame: DataFrame) -> Iterator:
    """The file indexes (Delta's ``TahoeFileIndex``) of the Delta table scans in ``frame``'s
    optimized plan, in plan order; scans inside subqueries are not walked."""
    tahoe = frame.sparkSession._jvm.org.apache.spark.util.Utils.classForName(
        "org.apache.spark.sql.delta.files.TahoeFileIndex", True, False)
    pending = [frame._jdf.queryExecution().optimizedPlan()]
    while pending:
        node = pending.pop()
        pending += reversed(scala_items(node.children()))
        if node.nodeName() == TABLE_SCAN and node.relation().getClass().getSimpleName() == "HadoopFsRelation" \
                and tahoe.isInstance(node.relation().location()):
            yield node.relation().location()


def delta_reads(executed: DataFrame) -> tuple[SourceRead, ...]:
    """The Delta table scans of the plan a Spark job ran for ``executed`` (its optimized plan,
    computed by the job, with Delta's prepared scans: no work), in plan order."""
    reads = []
    for index in delta_file_indexes(executed):
        if index.getClass().getSimpleName() != "PreparedDeltaFileIndex":
            continue
        scan = index.preparedScan()
        if scan.scanned().files().isDefined() and scan.total().files().isDefined():
            reads.append(SourceRead(index.path().toString(), scan.version(), scan.scanned().files().get(),
                                    scan.total().files().get()))
    return tuple(reads)


def held_changes(updates: DataFrame, lo: int, key: tuple[str, ...], one_task: bool = False,
                 reads: bool = False) -> Changes:
    """``updates`` (times from ``lo`` on) consolidated and held, in one Spark job that also
    counts them and, for a keyed view, tells whether any key's row count changes: the updates
    are shuffled by the key once, so the consolidation and the per-(key, time) sums need no
    other shuffle, and both answers are observed metrics of the job that holds the rows. The
    sums are held with the rows: the keys whose count changes are read from them, no job.

    ``one_task``: the updates are few (see :func:`feed_is_small`); they are gathered into one
    partition instead, which needs no shuffle at all (one stage, one task).

    ``reads``: the Delta scans of the job are reported (:attr:`Changes.reads`)."""
    if not key:
        consolidated = consolidate(updates.coalesce(1) if one_task else updates)
        kept, size = checkpointed(consolidated)  # runs consolidated's own query execution
        return Changes(kept, size, lo, reads=delta_reads(consolidated) if reads else ())
    spread = updates.coalesce(1) if one_task else updates.repartition(*key)
    consolidated = consolidate(spread).withColumn(NET, key_count_change(key))
    executed = []
    moves, first = F.col(NET) != 0, F.col(key[0])
    kept, (size, changed, *bounds) = held_observing(
        consolidated, _OBSERVED, F.count(F.lit(1)).alias("size"),
        F.coalesce(F.max(moves), F.lit(False)).alias("changed"), F.min(F.when(moves, first)).alias("low"),
        F.max(F.when(moves, first)).alias("high"),
        F.coalesce(F.max(moves & first.isNull()), F.lit(False)).alias("nulls"),
        keep=[*updates.columns, NET], executed=executed)
    touched = kept.where(moves).select(*key)
    return Changes(kept.select(*updates.columns), size, lo, changed, touched, touched_bounds=key_bounds(*bounds),
                   reads=delta_reads(executed[0]) if reads else ())


def key_bounds(low, high, nulls) -> tuple | None:
    """``(low, high, has_null)`` as observed by a Spark job, where its values are Python's (integers
    and strings; a value of another type comes back as a JVM object, which nothing prunes by):
    else None."""
    plain = all(v is None or isinstance(v, (int, str)) and not isinstance(v, bool) for v in (low, high))
    return (low, high, bool(nulls)) if plain else None


#: The change data feed files one task reads and consolidates (see :func:`feed_is_small`).
ONE_TASK_BYTES = 8 << 20
#: Commits whose log entries are read to size a change feed; a longer range is not sized.
_SIZED_COMMITS = 16


def feed_is_small(path: str, first: int, last: int) -> bool:
    """Whether the change feed of versions ``first`` to ``last`` reads at most
    :data:`ONE_TASK_BYTES` of files (from the log): one task holds it in well under a second,
    where a shuffle's extra stage costs about 0.1 s."""
    size = change_data_bytes(path, first, last, _SIZED_COMMITS)
    return size is not None and size <= ONE_TASK_BYTES


class SourceChangesLost(ConfigError):
    """Neither the change feed nor the snapshots of a range of source versions can be read."""


class SourceSchemaChanged(ConfigError):
    """A source's columns changed so that the view's rows cannot be computed with its schema."""


def unreadable(exc: Exception) -> str | None:
    """The first line of ``exc`` if it says the data is gone or unreadable for good, else None."""
    text = str(exc)
    if not any(marker in text for marker in _UNREADABLE):
        return None
    start = text.find("[")
    return text[start if start >= 0 else 0:].splitlines()[0][:300]
