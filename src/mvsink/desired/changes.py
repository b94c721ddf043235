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
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink.correction import checkpointed, held_observing
from mvsink.desired.join import is_ranged, ranges_of
from mvsink.desired.key_check import key_count_change
from mvsink.desired.refresh import Fallback
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
    #: Ranges covering the values of :attr:`touched`'s first key column, and whether one is null
    #: (:func:`touched_ranges`), where known: the key check reads only the table's files that can
    #: hold them. None: not known.
    touched_ranges: tuple[list[tuple], bool] | None = None
    #: How they were computed: ``change feed`` or ``snapshot difference`` (a change-feed view),
    #: ``row-wise``, ``linear aggregate`` (``linear aggregate of linear aggregate``, ``of per-group
    #: recompute``, ``of per-key recompute``), ``per-group recompute``, ``per-key recompute``,
    #: ``inner join``, ``union all`` or ``full evaluation`` (a query view).
    strategy: str = ""
    #: The files of Delta tables the job that held them scanned (:func:`delta_reads`; the other
    #: sides of a join), where known.
    reads: tuple[SourceRead, ...] = ()
    #: The change's bytes over the sources' bytes (a query view's,
    #: :mod:`mvsink.desired.change_size`), where known.
    change_share: float | None = None
    #: Why a query view's changes are a ``full evaluation`` (None: they are not).
    fallback: Fallback | None = None
    #: What of the step was computed in this process: ``terms`` (the join's change terms,
    #: :mod:`mvsink.desired.in_process`), ``terms and groups`` (and the groups' state moved,
    #: :mod:`mvsink.desired.arrow_groups`); empty: none.
    in_process: str = ""


@dataclass(frozen=True)
class SourceRead:
    """A scan of a Delta table at one version: the files it read after data skipping, of all."""

    table: str
    version: int
    files: int
    total_files: int

    def __str__(self) -> str:
        return f"{self.table}@v{self.version} {self.files}/{self.total_files} files"


def delta_file_indexes(frame: DataFrame, analyzed: bool = False) -> Iterator:
    """The file indexes (Delta's ``TahoeFileIndex``) of the Delta table scans in ``frame``'s
    optimized plan (``analyzed``: its analyzed plan, which names the same tables without Delta
    preparing each scan, 0.4-0.6 s a table read at a version), in plan order; scans inside
    subqueries are not walked."""
    utils = frame.sparkSession._jvm.org.apache.spark.util.Utils
    # Classes, not names: Delta's relation in an analyzed plan is an anonymous subclass.
    files, tahoe = (utils.classForName(name, True, False) for name in (
        "org.apache.spark.sql.execution.datasources.HadoopFsRelation",
        "org.apache.spark.sql.delta.files.TahoeFileIndex"))
    execution = frame._jdf.queryExecution()
    pending = [execution.analyzed() if analyzed else execution.optimizedPlan()]
    while pending:
        node = pending.pop()
        pending += reversed(scala_items(node.children()))
        if node.nodeName() == TABLE_SCAN and files.isInstance(node.relation()) \
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
                 reads: bool = False, few: bool | None = None) -> Changes:
    """``updates`` (times from ``lo`` on) consolidated and held, in one Spark job that also
    counts them and, for a keyed view, tells whether any key's row count changes: the updates
    are shuffled by the key once, so the consolidation and the per-(key, time) sums need no
    other shuffle, and both answers are observed metrics of the job that holds the rows. The
    sums are held with the rows: the keys whose count changes are read from them, no job.

    ``one_task``: the updates are few (see :func:`feed_is_small`); they are gathered into one
    partition instead, which needs no shuffle at all (one stage, one task).

    ``reads``: the Delta scans of the job are reported (:attr:`Changes.reads`).

    ``few`` (default ``one_task``): the updates come from a small change, so the distinct values of
    the touched keys' first column are observed (:attr:`Changes.touched_ranges`), not only their
    least and greatest."""
    if not key:
        consolidated = consolidate(updates.coalesce(1) if one_task else updates)
        kept, size = checkpointed(consolidated)  # runs consolidated's own query execution
        return Changes(kept, size, lo, reads=delta_reads(consolidated) if reads else ())
    spread = updates.coalesce(1) if one_task else updates.repartition(*key)
    consolidated = consolidate(spread).withColumn(NET, key_count_change(key))
    executed = []
    moves, first = F.col(NET) != 0, F.col(key[0])
    few = one_task if few is None else few
    kept, (size, changed, values, nulls) = held_observing(
        consolidated, _OBSERVED, F.count(F.lit(1)).alias("size"),
        F.coalesce(F.max(moves), F.lit(False)).alias("changed"),
        *touched_values([(moves, first)], few), keep=[*updates.columns, NET], executed=executed)
    touched = kept.where(moves).select(*key)
    return Changes(kept.select(*updates.columns), size, lo, changed, touched,
                   touched_ranges=touched_ranges(values, nulls, updates.schema[key[0]].dataType, few),
                   reads=delta_reads(executed[0]) if reads else ())


def touched_values(touches: list[tuple[Column, Column]], small: bool) -> list[Column]:
    """Aggregates over the rows of ``touches`` (pairs: whether a row touches a key, and the key's
    first column): the values it takes where a row touches one, distinct (``small``) or their
    least and greatest, as a sorted JSON array, and whether a null is among them; read by
    :func:`touched_ranges`."""
    found = [F.when(touching, column) for touching, column in touches]
    if small:
        sets = [F.collect_set(v) for v in found]
        values = sets[0] if len(sets) == 1 else F.array_union(*sets)
    else:
        lows, highs = [F.min(v) for v in found], [F.max(v) for v in found]
        bounds = [F.least(*lows), F.greatest(*highs)] if len(found) > 1 else [*lows, *highs]
        values = F.filter(F.array(*bounds), lambda v: v.isNotNull())
    nulls = reduce(Column.__or__, [touching & column.isNull() for touching, column in touches])
    return [F.to_json(F.sort_array(values)), F.coalesce(F.max(nulls), F.lit(False))]


def touched_ranges(values: str, nulls: bool, data_type: T.DataType, small: bool) -> tuple[list[tuple], bool] | None:
    """The ranges covering the observed ``values`` (of :func:`touched_values`, ``small`` as
    there) of a column of ``data_type``, and ``nulls``; None where the type is not pruned by
    ranges."""
    if not is_ranged(data_type.simpleString()):
        return None
    return ranges_of(values, data_type, cut=small), bool(nulls)


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
