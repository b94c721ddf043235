"""A replica of one view: the mint -> write -> append loop over the correction buffer.

Each :meth:`MaterializedView.step` (one trigger, e.g. one ``foreachBatch`` call) does:

1. read back the commits made to the target since the last step (anyone's), with the undo of
   each foreign commit among them;
2. a writer whose sources have moved past the timeline's latest time mints the next time
   (:mod:`mvsink.timeline`); then the input is read up to the timeline's upper (the first step
   hydrates: the view's contents at `max(as_of, upper - 1)`, and the whole table on the persisted
   side);
3. fold both into the correction buffer (`desired - persisted`), times advanced to the persist
   frontier; recompute key violations for the keys that changed (a hydration into an empty
   table holds its snapshot as it is, and the staging of step 5 reports whether every key
   has one row: :meth:`MaterializedView._check_held_keys`). A writer that has computed
   every time and still finds a correction due at a time already in the table (drift: damage,
   a lost write) mints a *repair time* with the same source versions, so that the repair has a
   time to go to without waiting for a source commit;
4. mint a description `[lower, upper)` if allowed (not read-only, desired ahead of the table, the
   table advanced since the last description);
5. write: stage the corrections below `upper` as Parquet files (none if there are none). In the
   table layout (:mod:`mvsink.target.layout`) `upper` is first cut to the next time at which the buffer
   changes the view (:meth:`MaterializedView._cap`), added rows and error updates are staged
   apart, and retractions rewrite the files that hold them (:mod:`mvsink.write.rewrite`). In
   the update layout the batch also holds the pending undos of foreign commits below `lower` at
   their own times (and their sum, negated, at `lower`): the table's history becomes exactly the
   view's again, and its contents from `lower` on are the buffer's;
6. append: compare-and-append them; a loser deletes its files and the next step reads back what
   the winner wrote; a winner then keeps the table to the view's retention (compaction, log
   checkpoints: :mod:`mvsink.append.retention`).

Nothing here keeps the view on the driver: the buffer, the input and the read-back are Spark
DataFrames; the driver sees versions, file lists and counts.

Between two steps, :meth:`MaterializedView.plan` gives the updates the next commit would write
(for a read-only replica: its first commit once promoted), computed as a commit's are; a step that
hydrates reports its progress through :class:`~mvsink.desired.hydration.Hydration`.

The micro-batch a ``foreachBatch`` hands over only triggers a step: mvsink reads its input itself
at the versions the timeline pins, so that all replicas see the same times and rows. A job steps
its views on a timer instead (:meth:`MaterializedView.start_stream`, a
:class:`~mvsink.step_loop.StepLoop`), without a micro-batch's cost.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from functools import cached_property, reduce
from typing import Callable, NamedTuple
from dataclasses import dataclass, field, replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import storage
from mvsink.target import layout
from mvsink.append import Shard, compare_and_append
from mvsink.target.commit_info import (META_HISTORY, META_READBACK, REASON_CORRECTION, REASON_PROGRESS,
                                       REASON_REPAIR)
from mvsink.append.fence import Fence, Fenced
from mvsink.append.retention import Retention, Upkeep
from mvsink.arrow_memory import use_system_allocator
from mvsink.cleanup import clean_orphans
from mvsink.correction import CorrectionBuffer, checkpointed, state_lost
from mvsink.correction.readback import ReadBack, ReadBackError
from mvsink.definition import definition_id
from mvsink.desired.changes import Changes
from mvsink.desired.choose import desired_for
from mvsink.desired.hydration import Hydration
from mvsink.desired.refresh import Fallback
from mvsink.desired.key_check import DUPLICATE_KEY, KeyErrors, KeyRanges, unique_keys, unique_keys_by_shuffle
from mvsink.target.layout import META_ERRORS, TABLE
from mvsink.metrics import ViewMetrics
from mvsink.step_loop import StepLoop
from mvsink.step_profile import PHASES, StepProfile
from mvsink.mint import Description, Minter
from mvsink.table import latest_version, live_files
from mvsink.target.create import create_target, validate_target
from mvsink.target.guard import allows_deletion_vectors
from mvsink.target.ownership import check_target_owned
from mvsink.timeline import (REASON_REPAIR_TIME, REASON_SOURCES, Timeline, TimeWentBackwards)
from mvsink.updates import DIFF, ERROR, HELD, RESERVED, TIME, advance_times, consolidate, negate
from mvsink.view import ConfigError, ViewDefinition
from mvsink.write import ERRORS_DIR, StagedBatch, batch_updates, stage
from mvsink.write.plain import stage_plain
from mvsink.write.deletion_vectors import logical_file, path_of
from mvsink.write.rewrite import TableFile, files_in_ranges

log = logging.getLogger(__name__)

#: Look for orphaned staged files every this many steps (and at the first writable step).
_CLEANUP_EVERY = 50
#: The most key violations started (and ended) one key check logs.
_LOGGED_VIOLATIONS = 20

__all__ = ["MaterializedView", "NotCaughtUp", "StepReport", "TimeWentBackwards"]


class NotCaughtUp(RuntimeError):
    """The replica has not computed the view up to the table's upper yet: no plan to show."""


class _Staged(NamedTuple):
    """A staged batch and how many of its updates restore history (see :func:`_commit_updates`)."""

    batch: StagedBatch
    history_updates: int | None


@dataclass
class StepReport:
    """What one step did, for logs and tests."""

    table_version: int
    upper: int
    desired_frontier: int | None
    corrections: int
    desc: Description | None = None
    appended: bool | None = None
    files: int = 0
    seconds: float = 0.0
    #: The timeline's upper after the step, and the time this step minted on it (if any).
    timeline_upper: int = 0
    minted_time: int | None = None
    #: Foreign commits the step's append repaired.
    repairs: int = 0
    #: Seconds and Spark jobs per phase (:mod:`mvsink.step_profile`).
    phase_seconds: dict[str, float] = field(default_factory=dict)
    spark_jobs: dict[str, int] = field(default_factory=dict)
    #: How the step computed the view's changes (:attr:`mvsink.desired.changes.Changes.strategy`),
    #: ``hydration`` for its contents at one time; None if it read none.
    strategy: str | None = None
    #: The Delta scans the step's changes read (:attr:`mvsink.desired.changes.Changes.reads`: the
    #: files of each other side of a join read, of all), where known.
    reads: tuple = ()
    #: A query view's change against its sources (:attr:`mvsink.desired.changes.Changes.change_share`:
    #: their bytes), where known; and why the step evaluated the query in full
    #: (:class:`~mvsink.desired.refresh.Fallback`), None if it did not.
    change_share: float | None = None
    fallback: Fallback | None = None
    #: What of the step was computed in this process, not by Spark
    #: (:attr:`mvsink.desired.changes.Changes.in_process`).
    in_process: str = ""

    @property
    def idle(self) -> bool:
        """The step found nothing to do: no time minted, nothing to write, no append, no repair
        (logged at DEBUG: an idle view would log every trigger)."""
        return (self.desc is None and self.appended is None and self.minted_time is None
                and not self.corrections and not self.repairs)

    def __str__(self) -> str:
        appended = {None: "no append", True: "won", False: "lost"}[self.appended]
        desc = f"[{self.desc.lower}, {self.desc.upper})" if self.desc else "none"
        phases = ", ".join(f"{name} {sec:.2f}s/{self.spark_jobs.get(name, 0)}j"
                           for name, sec in self.phase_seconds.items())
        return (f"table v{self.table_version} upper {self.upper}, timeline {self.timeline_upper}"
                f"{f' (minted {self.minted_time})' if self.minted_time is not None else ''}, "
                f"{self.corrections} corrections, batch {desc} {appended} ({self.files} files"
                f"{f', {self.repairs} repairs' if self.repairs else ''}) in {self.seconds:.2f}s"
                f"{f' by {self.strategy}' if self.strategy else ''}"
                f"{f' ({self.in_process} in process)' if self.in_process else ''}"
                f"{f' ({self.fallback})' if self.fallback else ''}"
                f"{f', change {self.change_share:.3%} of the sources' if self.change_share is not None else ''}"
                f"{' reading ' + ', '.join(map(str, self.reads)) if self.reads else ''}: {phases}")


class MaterializedView:
    def __init__(self, spark: SparkSession, view: ViewDefinition, orphan_grace_seconds: float = 3600.0,
                 max_consecutive_failures: int = 3):
        self.spark = spark
        use_system_allocator()
        self.max_consecutive_failures = max_consecutive_failures
        self._failures = 0
        #: Why the view's steps stopped (a failure :meth:`foreach_batch` let through), or None.
        self.failure: str | None = None
        #: Held for a whole step: :meth:`plan` reads the buffer and frontiers between two steps.
        self._step_lock = threading.RLock()
        self.view = view
        self.orphan_grace_seconds = orphan_grace_seconds
        self.shard = Shard(view.target, view.app_id, view.view_id, view.replica_id)
        self.shard.deletion_vectors = view.deletion_vectors != "off"
        table_upper = self._table_upper()
        check_target_owned(view)
        self.timeline = Timeline(view.timeline, view.sources, view.replica_id)
        self.timeline.refresh()
        self.desired = desired_for(spark, view, self.timeline)
        self.schema = self.desired.schema
        self.layout = layout.resolve(view.target, view.layout, view.view_id)
        validate_target(spark, view, self.schema, self.layout)
        self._check_times(table_upper)
        self.minter = Minter(view.as_of, view.read_only)
        #: The view's definition id (:mod:`mvsink.definition`); the shard writes only under it.
        self.definition = definition_id(view, self.schema)
        self.shard.fence = Fence(view.target, view.view_id, self.definition, view.replica_id)
        if not view.read_only:
            self.shard.fence.allow_writes(self._latest_table(), cutover=False)
        log.info("view %s (replica %s): definition %s", view.view_id, view.replica_id, self.definition)
        #: When held state was lost with an executor (monotonic seconds); None once hydrated again.
        self._state_lost_at: float | None = None
        self.upkeep = Upkeep(Retention.parse(view.retain_history))
        self.metrics = ViewMetrics()
        self.correction = CorrectionBuffer(self.desired.session(), self.schema)  # unions optimized as the view's plans are
        self.readback = ReadBack(spark, self.shard, self.schema, self.layout)
        #: The running (or last) step's profile.
        self._profile = StepProfile(spark)
        self.desired_frontier: int | None = None
        #: Foreign commits not yet accounted for by an mvsink commit: version -> its undo.
        self.pending_repairs: dict[int, DataFrame] = {}
        self._readback_version = -1
        self._files_seen: tuple[frozenset[str], list[TableFile]] | None = None  # see _table_files
        #: The view's upper as this replica last saw it (read back, or moved by its own append).
        self.observed_upper = 0
        #: How often this replica has hydrated (read the whole input): once, unless restarted.
        self.hydrations = 0
        self.hydration = Hydration(spark, view.view_id)
        #: The buffer holds a hydration's snapshot whose keys are not checked yet (:meth:`_hold_unchecked`).
        self._keys_unchecked = False
        #: Rows may be withheld for a key violation (:meth:`_check_keys`): every change is checked.
        self._withholding = False
        self._steps = 0
        log.info("view %s (replica %s) on %s (%s layout): %s over %s, key %s, as_of %d, timeline %s",
                 view.view_id, view.replica_id, view.target, self.layout, type(view.input).__name__,
                 view.sources, list(view.key), view.as_of, view.timeline)

    @property
    def read_only(self) -> bool:
        return self.minter.read_only

    def allow_writes(self, cutover: bool = True) -> None:
        """Leave read-only mode for good; the next step may write.

        ``cutover`` (an operator's allow-writes): the first commit raises the fence to this
        view's definition. Without it (a replica started as a writer) the table must be fenced
        for this definition or none: otherwise :class:`~mvsink.append.fence.DefinitionRefused`,
        and the view stays read-only and is fenced (:mod:`mvsink.append.fence`)."""
        if self.read_only:
            self.shard.fence.allow_writes(self._latest_table(), cutover)
            log.info("view %s (replica %s): writes allowed%s", self.view.view_id, self.view.replica_id,
                     " (a cutover)" if cutover else "")
        self.minter.allow_writes()

    @property
    def fenced(self) -> str | None:
        """Why this replica may never write again (another definition holds the fence), or None."""
        return self.shard.fence.reason

    def _latest_table(self):
        return self.shard.table() if latest_version(self.view.target) is not None else None

    @property
    def steps(self) -> int:
        return self._steps

    def frontier(self) -> int | None:
        """The view's write frontier at this replica: times below it are computed and in the table.

        It is the lesser of the input frontier this replica has computed and the table's upper it
        has seen; None before hydration. It never goes back (both parts only advance).
        """
        if self.desired_frontier is None:
            return None
        return min(self.desired_frontier, self.observed_upper)

    def foreach_batch(self, _batch: DataFrame | None, batch_id: int) -> None:
        """For ``writeStream.foreachBatch``: run one step (the micro-batch only triggers it).

        A failed step is retried at the next trigger (its state was reset, see :meth:`step`);
        after ``max_consecutive_failures`` in a row, or on a configuration error, the error
        propagates and stops the query.
        """
        try:
            report = self.step()
        except ConfigError as exc:
            self.metrics.failures += 1
            self.failure = str(exc)
            raise
        except Exception as exc:
            self._failures += 1
            self.metrics.failures += 1
            if self._failures >= self.max_consecutive_failures:
                self.failure = str(exc)
                raise
            log.exception("batch %d failed (%d in a row); retrying at the next trigger", batch_id,
                          self._failures)
            return
        self._failures = 0
        log.log(logging.DEBUG if report.idle else logging.INFO, "batch %d: %s", batch_id, report)

    def _table_upper(self) -> int:
        return self.shard.verified_upper() if latest_version(self.view.target) is not None else 0

    def _check_times(self, upper: int) -> None:
        """The target's upper cannot be past the timeline's: read the upper first, then this."""
        timeline_upper = self.timeline.refresh()
        if upper > timeline_upper and upper > self.view.as_of:
            raise TimeWentBackwards(
                f"view {self.view.view_id!r}: the target's upper {upper} is past the upper "
                f"{timeline_upper} of its timeline {self.view.timeline}; was the timeline deleted, "
                "recreated or replaced?"
            )

    # -- one step -------------------------------------------------------------------------------

    def step(self) -> StepReport:
        with self._step_lock:
            self._profile = StepProfile(self.spark)
            try:
                with self._profile.tagged():
                    return self._step()
            except BaseException as exc:
                if self.hydration.running:
                    self.hydration.abort(exc)
                if isinstance(exc, Fenced):
                    self.minter.read_only = True  # for good: allow_writes refuses a fenced view
                elif state_lost(exc):
                    log.warning("view %s: state held on an executor was lost with it; dropping all held state, "
                                "the next step hydrates again: %s", self.view.view_id, str(exc).splitlines()[0][:300])
                    self._forget()
                    self._state_lost_at = self._state_lost_at or time.monotonic()
                raise

    def _step(self) -> StepReport:
        started = time.monotonic()
        profile = self._profile
        self._strategy: str | None = None
        self._reads: tuple = ()
        self._change_share, self._fallback, self._in_process = None, None, ""
        minted = None
        try:
            persisted, minted = self._reconcile()
        except Exception as exc:
            # The buffer may have missed what the failed reconcile consumed: start over from the
            # table and the sources, as a restarted replica would.
            self._forget()
            if not isinstance(exc, ReadBackError):
                raise
            log.warning("read-back cannot follow the table (%s); rehydrating", exc)
            persisted, minted = self._reconcile()
        self.observed_upper = max(self.observed_upper, persisted.upper)
        self.minter.advance_persist(max(self.view.as_of, persisted.upper))
        if self.desired_frontier is not None:
            self.minter.advance_desired(self.desired_frontier)
        desc = self._cap(self.minter.maybe_mint())
        try:
            staged = self._check_held_keys(desc)
            with profile.phase("correction"):
                corrections = self.correction.count()
            report = StepReport(persisted.version, persisted.upper, self.desired_frontier, corrections,
                                timeline_upper=self.timeline.upper, minted_time=minted, desc=desc,
                                strategy=self._strategy, reads=self._reads, change_share=self._change_share,
                                fallback=self._fallback, in_process=self._in_process)
            if self.hydration.running:
                self.hydration.finish(corrections)
                self.desired.hydrated(self.hydration.last_seconds)
            if desc is not None:
                repairing = len(self.pending_repairs)
                report.appended, report.files = self._write_and_append(desc, staged)
        except Exception:
            if desc is not None:
                self.minter.abandon(desc)
            if self._keys_unchecked:  # the buffer is not known to be right: hydrate again
                self._forget()
            raise
        if desc is not None and report.appended:
            self.observed_upper = max(self.observed_upper, desc.upper)
            report.repairs = repairing
            with profile.phase("upkeep"):
                self.upkeep.run(self)
        self._steps += 1
        if self._state_lost_at is not None and self.desired_frontier is not None:
            log.warning("view %s: recovered from the lost executor state in %.1fs by hydrating again at time %d",
                        self.view.view_id, time.monotonic() - self._state_lost_at, self.desired_frontier - 1)
            self._state_lost_at = None
        if not self.read_only and (self._steps == 1 or self._steps % _CLEANUP_EVERY == 0):
            with profile.phase("upkeep"):
                clean_orphans(self.shard, self.orphan_grace_seconds)
        report.seconds = time.monotonic() - started
        profile.count_jobs()
        report.phase_seconds = {name: profile.seconds[name] for name in PHASES if name in profile.seconds}
        report.spark_jobs = profile.spark_jobs
        self.metrics.record(report)
        return report

    def _reconcile(self):
        """Steps 1-3: read back, mint a time if due, read the input, fold into the buffer.

        Returns what was read back and the time this replica minted (None if none)."""
        profile = self._profile
        with profile.phase("readback"):
            persisted = self.readback.poll()
        self._readback_version = persisted.version
        self.pending_repairs.update(persisted.foreign)
        for version in [v for v in self.pending_repairs if v <= persisted.accounted_through]:
            del self.pending_repairs[version]
        if persisted.foreign:
            log.warning("foreign commits at versions %s: they will be repaired", sorted(persisted.foreign))
        minted = None
        with profile.phase("mint"):
            self._check_times(persisted.upper)
            latest = self.desired.latest_versions()
            self.desired.warn_of_new_columns(latest)
            self.timeline.check_not_behind(latest)
            last = self.timeline.last()
            computed_all = self.desired_frontier in (None, self.timeline.upper)
            if not self.read_only and computed_all and (last is None or last.versions != latest):
                minted = self._mint_time(latest, REASON_SOURCES)
        hydrating = self.desired_frontier is None
        with profile.phase("input"):
            desired = self._read_desired(persisted)
        self._fold(persisted.updates, desired, persisted, hydrated=hydrating and desired is not None)
        with profile.phase("correction"):
            drifted = not self.read_only and self._drifted(persisted)
        if drifted:
            with profile.phase("mint"):
                minted = self._mint_time(self.timeline.last().versions, REASON_REPAIR_TIME)
            with profile.phase("input"):
                desired = self._read_desired(persisted)
            if desired is not None:
                self._fold(None, desired, persisted)
        return persisted, minted

    def _cap(self, desc: Description | None) -> Description | None:
        """In the table layout, ``desc`` ending at the first time after its lower at which the
        buffer changes the view: a commit makes the table the view at every time it covers
        (:mod:`mvsink.target.layout`), so it covers no time at which the view changes but its lower."""
        if desc is None or self.layout != TABLE or desc.upper - desc.lower == 1 or self.correction.size == 0:
            return desc
        with self._profile.phase("mint"):
            later = self.correction.updates.where(F.col(TIME) > F.lit(desc.lower)).agg(F.min(TIME)).first()[0]
        return desc if later is None or later >= desc.upper else Description(desc.lower, later)

    def _mint_time(self, versions: dict[str, int], reason: str) -> int | None:
        time_ = self.timeline.upper
        return time_ if self.timeline.extend(versions, reason, at=time_) else None

    def _drifted(self, persisted) -> bool:
        """Whether the buffer holds a correction for a time the table already has, with every
        time computed: nothing but a new time can carry it."""
        caught_up = (self.desired_frontier is not None and self.desired_frontier == self.timeline.upper
                     and persisted.upper >= self.desired_frontier)
        if not caught_up:
            return False
        if self.pending_repairs:
            return True
        return self.correction.size != 0 and not self.correction.updates.where(
            F.col(TIME) <= F.lit(persisted.upper)).isEmpty()

    def _read_desired(self, persisted) -> Changes | DataFrame | None:
        """The input's updates from the desired frontier to the timeline's upper, held in Spark
        (:class:`~mvsink.desired.changes.Changes`); at the first step the hydration's snapshot, lazy (read
        once, by the fold: its time shows in the correction phase); None if there are none."""
        desired = None
        upper = self.timeline.upper
        if self.desired_frontier is None:
            hydrate_at = max(self.view.as_of, persisted.upper - 1)
            if upper > hydrate_at:
                self.hydration.start(hydrate_at, self.timeline.versions(hydrate_at))
                desired = self.desired.snapshot(hydrate_at)
                self._strategy = "hydration"
                self.desired_frontier = hydrate_at + 1
                self.hydrations += 1
        elif upper > self.desired_frontier:
            desired = self.desired.changes(self.desired_frontier, upper - 1)
            self.desired_frontier = upper
            if desired is not None:
                self._strategy, self._reads = desired.strategy, desired.reads
                self._change_share, self._fallback = desired.change_share, desired.fallback
                self._in_process = desired.in_process
        return desired

    def _fold(self, persisted_updates: DataFrame | None, desired: Changes | DataFrame | None, persisted,
              hydrated: bool = False) -> None:
        """Fold ``desired`` minus ``persisted_updates`` (what the read-back brought, None if
        nothing or already folded) into the buffer, with times advanced to ``persisted``'s upper,
        and recheck the keys ``desired`` touched (every key when ``hydrated``: the buffer was
        empty and ``desired`` is the view's whole contents).

        Changes into an empty buffer with nothing read back, the steady state, are the buffer as
        they are (consolidated, held, at or after the since): no Spark job."""
        since = max(self.view.as_of, persisted.upper)
        if hydrated and persisted_updates is None and self.view.key and self.correction.size == 0:
            self._hold_unchecked(desired, since)
            return
        self._check_held_keys(None)  # a snapshot held this step is checked before anything joins it
        held = isinstance(desired, Changes)
        updates = desired.updates if held else desired
        empty = persisted_updates is None and self.correction.size == 0
        if held and empty and desired.lo >= max(since, self.correction.since):
            self.correction.hold(desired.updates, desired.size, since)
        else:
            changes = ([negate(persisted_updates)] if persisted_updates is not None else []) + (
                [updates] if updates is not None else [])
            try:
                with self._profile.phase("correction"):
                    self.correction.apply(changes, since)
            except Exception as exc:
                missing_file = "FileNotFound" in str(exc) or "does not exist" in str(exc)
                if persisted_updates is not None and missing_file:
                    raise ReadBackError(f"a committed file is gone: {exc}") from exc
                raise
        if updates is not None and self.view.key:
            with self._profile.phase("key_check"):
                self._check_keys(None if hydrated else desired, since)

    def _hold_unchecked(self, snapshot: DataFrame, since: int) -> None:
        """Hydrating a view with a key into a table with no rows: the buffer holds the snapshot as
        it is, its keys not checked yet (:meth:`_check_held_keys`, in this step). A snapshot that
        runs user code to read is materialized by the first job that reads it; a stored one is read
        again instead (a copy's cost: one read, one write)."""
        held = advance_times(snapshot.select(*self.schema.names), since)
        if not self.desired.snapshot_is_stored:
            held = held.localCheckpoint(eager=False)
        self.correction.hold(held, None, since)
        self._keys_unchecked = True

    def _check_held_keys(self, desc: Description | None) -> _Staged | None:
        """Whether a snapshot held unchecked (:meth:`_hold_unchecked`) has every key once with
        diff 1: then it is the consolidated buffer with no key violation. Otherwise it is
        consolidated and its keys checked as any fold's are. Nothing to do for a buffer checked.

        Where the step writes the whole buffer (``desc``), the staging's tasks report their
        files' key ranges, and the snapshot is not read again where those settle the answer
        (:class:`~mvsink.desired.key_check.KeyRanges`); the staged files are returned for the write
        (deleted if the keys are not unique: they hold the rows unconsolidated)."""
        if not self._keys_unchecked:
            return None
        ranges = KeyRanges.of(self.correction.updates, self.view.key)
        staged, settled = None, None
        if desc is not None and ranges is not None and self._stages_whole_buffer(desc):
            staged = self._stage(desc, ranges)
            settled = ranges.settle(staged.batch.key_reports)
        with self._profile.phase("key_check"):
            if settled is None:
                check = unique_keys if staged is None else unique_keys_by_shuffle  # ranges tried
                settled = check(self.correction.updates, self.view.key)
        self._keys_unchecked = False
        size, unique = settled
        if unique:
            self.correction.keys_checked(size)
            return staged
        if staged is not None:
            staged.batch.delete()
        with self._profile.phase("correction"):
            self.correction.keys_checked(None)
        with self._profile.phase("key_check"):
            self._check_keys(None, self.correction.since)
        return None

    def _stages_whole_buffer(self, desc: Description) -> bool:
        """Whether the batch for ``desc`` is the buffer's updates as they are: no undos to add,
        and the buffer's times (a held snapshot's: all at its since) in `[lower, upper)`."""
        return not self.pending_repairs and desc.lower <= self.correction.since < desc.upper

    @cached_property
    def _key_errors(self) -> KeyErrors:
        """The key's error expressions, built when a key is first checked (0.2 s of Spark
        expressions that a view never checking a key does not pay for)."""
        return KeyErrors(self.view.key, self.schema)

    def _check_keys(self, desired: Changes | None, since: int) -> None:
        """Recompute key violations where a key's row count changed (everywhere if ``desired`` is
        None: a hydration). Desired contents are the buffer plus what it was reconciled with: the
        table's files as the read-back last saw them.

        Whether any count changed came with the changes (:attr:`Changes.key_counts_change`): in
        the common case, updates in place, it did not, and this runs no Spark job. While rows are
        withheld for a violated key (:mod:`~mvsink.desired.key_check`) every change is checked:
        an update in place of a withheld row must stay withheld.
        """
        touched, files = None, None
        if desired is not None:
            if not desired.key_counts_change and not self._withholding:
                return
            # At most as many keys as updates. While rows are withheld, every key updated: an
            # update in place of a withheld row counts no key, and is checked all the same.
            keys = desired.updates.select(*self.view.key) if self._withholding else desired.touched
            touched = keys, desired.size
            # A withheld row is in an error file (read whatever the ranges), and a key updated in
            # place has all its rows there if it is violated; if not, its rows need not be read.
            files = (self._files_holding(desired.touched_ranges) if desired.key_counts_change
                     else self._error_files())
        fix = self._key_errors.corrections(self.readback.contents(files), self.correction.updates, touched, since)
        # Materialized apart (small: errors and violated keys' rows only), so that a view without
        # violations, the common case, does not fold and re-checkpoint the whole buffer for nothing.
        fix, size = checkpointed(fix)
        if size:
            self.correction.apply([fix], since)
            self._log_violations(fix)
        if size or desired is None:
            self._withholding = self._withholds()

    def _error_files(self) -> set[str] | None:
        """The table layout's error files as last read back (None in the update layout: all files)."""
        if self.layout != TABLE:
            return None
        return {p for p in self.readback.files if p.startswith(ERRORS_DIR + "/")}

    def _withholds(self) -> bool:
        """Whether the table as read back and the buffer withhold a row (one Spark job, run where
        a key check changed something, and after a hydration): only the table layout's error
        files can hold one."""
        errors = self._error_files()
        persisted = self.readback.contents(errors) if errors is None or errors else None
        updates = self.correction.updates if persisted is None else persisted.unionByName(self.correction.updates)
        held = updates.where(F.col(ERROR) == F.lit(HELD)).drop(TIME)
        return bool(held.groupBy(*[c for c in held.columns if c != DIFF]).agg(F.sum(DIFF).alias(DIFF))
                    .where(F.col(DIFF) > 0).limit(1).count())

    def _log_violations(self, fix: DataFrame) -> None:
        """Log, at WARNING, each key violation a key check's ``fix`` (materialized) starts or ends."""
        changes = (fix.where(F.col(ERROR).startswith(DUPLICATE_KEY)).select(ERROR, TIME, DIFF)
                   .orderBy(TIME, ERROR).limit(_LOGGED_VIOLATIONS * 2).collect())
        started = {(t, _key_of(e)): e for e, t, d in changes if d > 0}
        ended = sorted({(t, _key_of(e)) for e, t, d in changes if d < 0} - set(started))
        for (time_, _), message in sorted(started.items())[:_LOGGED_VIOLATIONS]:
            log.warning("view %s: %s at time %d: the key's rows are withheld from the view's rows (readers see "
                        "none of them) until it has one; mvsink status and view_errors show it",
                        self.view.view_id, message, time_)
        for time_, key in ended[:_LOGGED_VIOLATIONS]:
            log.warning("view %s: duplicate key %s ended at time %d: its row is back in the view's rows",
                        self.view.view_id, key, time_)

    def _files_holding(self, cut: tuple[list[tuple], bool] | None) -> set[str] | None:
        """The files the read-back saw that can hold rows whose first key column lies in ``cut``
        (its ranges and whether a null is asked for; None: any value), by their statistics, and
        every error file (a key's error rows are there); None where nothing is left out."""
        if cut is None or self.layout != TABLE:
            return None
        data = self._table_files()
        kept = files_in_ranges(data, *cut)
        if len(kept) == len(data):
            return None
        log.debug("view %s: the key check reads %d of the table's %d data files", self.view.view_id,
                  len(kept), len(data))
        return ({logical_file(f.path, f.deletion_vector) for f in kept}
                | {p for p in self.readback.files if p.startswith(ERRORS_DIR + "/")})

    def _forget(self) -> None:
        """Drop all state; the next reconcile hydrates from scratch."""
        self.correction.reset()
        self.readback.reset()
        self.desired_frontier = None
        self.pending_repairs = {}
        self._keys_unchecked = False

    def _stage(self, desc: Description, key_ranges: KeyRanges | None = None) -> _Staged:
        """Step 5: the batch for ``desc`` staged (with its files' key reports, given ``key_ranges``)."""
        with self._profile.phase("staging"):
            if latest_version(self.view.target) is None:
                create_target(self.view, self.schema, self.layout)
            undos = list(self.pending_repairs.values()) if self.layout != TABLE else []
            updates, history_updates = _commit_updates(desc, self.correction.updates, self.correction.since, undos)
            if self.layout == TABLE:
                return _Staged(self._stage_rows(updates, desc, key_ranges), None)
            batch = stage(updates, desc, self.view.target, self.view.view_id, self.view.replica_id, key_ranges)
        return _Staged(batch, history_updates)

    def _stage_rows(self, updates: DataFrame, desc: Description, key_ranges: KeyRanges | None) -> StagedBatch:
        """The table layout's batch (:func:`~mvsink.write.plain.stage_plain`), against the data
        files the read-back last saw."""
        columns = [f.name for f in self.schema.fields if f.name not in RESERVED]
        mark = self._marks_deletions()
        return stage_plain(self.spark, updates, desc, self.view.target, self.view.view_id, self.view.replica_id,
                           self._table_files(mark), columns, (self.view.key or columns)[0], key_ranges, mark)

    def _marks_deletions(self) -> bool:
        """Whether this step's retractions are marked in deletion vectors rather than rewritten:
        the view does not say ``off`` and the target allows them
        (:attr:`~mvsink.view.ViewDefinition.deletion_vectors`)."""
        return self.view.deletion_vectors != "off" and allows_deletion_vectors(
            self.readback.snapshot() or self.shard.table())

    def _table_files(self, with_adds: bool = False) -> list[TableFile]:
        """The data files the read-back last saw, with their statistics of the prune column
        (the key's first column, else the first) where the latest snapshot still has them, and
        ``with_adds`` their add actions as the read-back's version holds them. Kept for the same
        files (a file's statistics never change): a step's key check and its staging load the
        table's add actions once, from the read-back's snapshot where it holds these files."""
        paths = frozenset(p for p in self.readback.files if not p.startswith(ERRORS_DIR + "/"))
        if self._files_seen is not None and self._files_seen[0] == paths and (
                not with_adds or all(f.add is not None for f in self._files_seen[1])):
            return self._files_seen[1]
        self._files_seen = (paths, self._load_table_files(paths, with_adds))
        return self._files_seen[1]

    def _load_table_files(self, paths: frozenset[str], with_adds: bool) -> list[TableFile]:
        if not paths:
            return []
        column = (self.view.key or [f.name for f in self.schema.fields])[0]
        actions = (self.readback.snapshot() or self.shard.table()).get_add_actions(flatten=True)
        names = actions.column_names
        rows = zip(*(actions.column(c).to_pylist() if c in names else [None] * actions.num_rows
                     for c in ("path", "size_bytes", f"min.{column}", f"max.{column}", f"null_count.{column}")))
        wanted = {path_of(name): name for name in paths}
        known = {r[0]: TableFile(*r) for r in rows if r[0] in wanted}
        live = storage.retrying(f"listing the files of {self.view.target}", live_files, self.view.target,
                                self.readback.version) if with_adds else {}
        return [replace(known.get(path) or TableFile(path, 0),
                        deletion_vector=self.readback.deletion_vectors.get(name), add=live.get(path))
                for path, name in sorted(wanted.items())]

    def _write_and_append(self, desc: Description, staged: _Staged | None) -> tuple[bool, int]:
        """Steps 5-6 (the staging done already if ``staged``). Returns whether the append won
        and how many files it carried."""
        profile = self._profile
        batch, history_updates = staged or self._stage(desc)
        extra = {META_READBACK: self._readback_version}
        if history_updates is not None:
            extra[META_HISTORY] = history_updates
        error_files = None
        if self.layout == TABLE:
            error_files = self.readback.error_files + [f.path for f in batch.error_files]
            extra[META_ERRORS] = json.dumps(error_files)
        if self.pending_repairs:
            reason = REASON_REPAIR
        else:
            reason = REASON_PROGRESS if batch.empty else REASON_CORRECTION
        with profile.phase("commit"):
            result = compare_and_append(self.shard, desc, None if batch.empty else batch, reason,
                                        sorted(self.pending_repairs), extra=extra)
        if result.stale:
            self.minter.abandon(desc)
        if result.appended:
            # Own files need no read-back when nothing landed in between (the buffer knows them).
            exact = self.correction.since >= desc.lower  # the batch is the buffer's updates as they are
            adopted = not self.pending_repairs and self.readback.adopt(
                result.commit_ids, [f.path for f in batch.files], tuple(path for path, _ in batch.removes),
                error_files, tuple(batch.marked))
            if adopted:
                self.correction.drop_written(desc.upper, batch.num_records if exact else None)
            self.pending_repairs.clear()
        return result.appended, len(batch.files)

    def plan(self) -> tuple[Description, DataFrame]:
        """The description and the updates of the commit this replica would make next if it
        were allowed to write now: computed from the buffer and the pending repairs between two
        steps by the same function as a commit's (:func:`_commit_updates`), so a replica promoted
        while neither the sources nor the table move commits exactly these updates first.

        The description is `[lower, upper)` with lower the table's upper and upper the input
        frontier, or, with every time computed, the repair time a writer would mint
        (`lower + 1`). Raises :class:`NotCaughtUp` before hydration or while the input frontier
        is behind the table's upper.
        """
        with self._step_lock:
            lower, desired = self.minter.persist_frontier, self.desired_frontier
            if desired is None or desired < lower:
                state = "has not hydrated" if desired is None else f"has computed times below {desired} only"
                raise NotCaughtUp(f"view {self.view.view_id!r}: replica {self.view.replica_id} {state}; "
                                  f"the table's upper is {lower}; try again once it has caught up")
            corrections, since = self.correction.updates, self.correction.since
            undos = list(self.pending_repairs.values()) if self.layout != TABLE else []
            desc = self._cap(Description(lower, desired if desired > lower else lower + 1))
        return desc, _commit_updates(desc, corrections, since, undos)[0]

    # -- running -------------------------------------------------------------------------------

    def run_until_caught_up(self, max_steps: int = 100) -> StepReport:
        """Step until the table has every time and the latest time the sources' newest versions
        (writers only)."""
        for _ in range(max_steps):
            report = self.step()
            last = self.timeline.last()
            if (report.desc is None and last is not None and report.upper >= self.timeline.upper
                    and last.versions == self.desired.latest_versions()):
                return report
        raise RuntimeError(f"view {self.view.view_id!r} did not catch up in {max_steps} steps")

    def start_stream(self, trigger_seconds: float = 2.0, before_step: Callable[[], None] | None = None,
                     after_step: Callable[[], None] | None = None) -> StepLoop:
        """Run a step every ``trigger_seconds`` on a thread of its own (a :class:`StepLoop`), as
        :meth:`foreach_batch` does for a micro-batch: a failed step is retried at the next tick,
        up to ``max_consecutive_failures``. ``before_step`` runs before each step (operator
        requests), ``after_step`` after it, also after a failed one (progress reports).
        """

        def tick(n: int) -> None:
            if before_step is not None:
                before_step()
            try:
                self.foreach_batch(None, n)
            finally:
                if after_step is not None:
                    after_step()

        return StepLoop(self.spark, f"mvsink-{self.view.view_id}", trigger_seconds, tick, view_id=self.view.view_id)

    def stop_stream(self, loop: StepLoop, timeout_seconds: float = 60.0) -> None:
        """Stop a loop of :meth:`start_stream` between two steps: wait for the running step to end
        and let no further step start. A step still running after ``timeout_seconds`` has its Spark
        jobs cancelled: a step stopped anywhere loses nothing (see :meth:`step`)."""
        loop.stop(timeout_seconds)


def _key_of(message: str) -> str:
    """The key (JSON) a ``duplicate key {...}: n rows`` error names."""
    return message[len(DUPLICATE_KEY):message.rindex(": ")]


def _commit_updates(desc: Description, corrections: DataFrame, corrections_since: int,
                    undos: list[DataFrame]) -> tuple[DataFrame, int | None]:
    """The updates a commit for ``desc`` writes, and how many of them restore history (None
    without foreign commits to undo): the corrections below ``desc.upper`` and, for each undo,
    its updates below ``desc.lower`` at their own times and their sum taken back at ``lower``,
    where the buffer already has it: the contents from lower on are the buffer's, history is
    restored."""
    updates = batch_updates(corrections, desc, corrections_since)
    if not undos:
        return updates, None
    history = reduce(DataFrame.unionByName, undos)
    history = consolidate(history.where(F.col(TIME) < F.lit(desc.lower))).localCheckpoint(eager=True)
    updates = consolidate(updates.unionByName(history).unionByName(negate(advance_times(history, desc.lower))))
    return updates, history.count()
