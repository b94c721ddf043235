"""`append`: commits a staged batch with compare-and-append on the view's Delta ``txn`` version.

The view's *upper* is the version of the Delta application transaction (``txn`` action) whose
appId is the view's (:attr:`ViewDefinition.app_id`); a table without it has upper 0. Every
snapshot a shard loads to commit on is checked by :mod:`mvsink.target.guard` (features the commit
path cannot take are refused), and every upper it reads must not be below one it has seen. A batch for
`[lower, upper)` is one Delta commit that adds the staged files and sets the txn to `upper`, made
only if the txn is `lower` in the snapshot the commit is based on.

Why this is a compare-and-append: the commit goes through delta-rs, which writes the log entry
with put-if-absent (a hard link on local filesystems, a conditional PUT on S3), and fails with
``CommitFailedError`` when a commit that landed after its base snapshot carried a txn with the
same appId. Every mvsink commit carries that txn, so of two replicas that read the same upper at
most one commits; commits by foreign writers (no txn) do not conflict and are corrected later.
A commit that removes a file with a deletion vector, or adds one under a new vector (a batch
that marks its retractions, :attr:`mvsink.write.StagedBatch.marked`; a target that allows them,
:attr:`Shard.deletion_vectors`), is written by mvsink itself (:mod:`mvsink.append.log_entry`),
since delta-rs's actions cannot carry a vector: put-if-absent at the version after its base
snapshot, so any commit landing after that snapshot makes it fail the same way (and be tried again).

Outcomes:

* the upper is `lower`: commit, the upper becomes `upper`;
* the upper is behind `lower` (a first write at ``as_of``): first move it to `lower` with an empty
  commit, then append;
* the upper is past `lower` (another replica won): delete the staged files and report the upper;
  the winner's updates reach the correction buffer through read-back;
* the batch rewrites files (the table layout's retractions, :mod:`mvsink.write.rewrite`) that the
  snapshot no longer holds (a foreign commit removed them): the batch was computed against
  another table, so its files are deleted and it is reported *stale*; the read-back then brings
  the foreign commit in and the next batch is computed against it. The files are checked in the
  snapshot the commit is based on; delta-rs does not fail an append whose removed files a
  concurrent commit removed too, so a foreign rewrite landing between that check and the commit
  slips through, like any foreign commit landing after the read-back: that version holds the
  foreign change too, is no version of the view (:func:`mvsink.target.read.version_of_time`), and the
  read-back finds the drift for the next commit to repair.

Every commit records in its commit info: view, replica, lower, upper, why it was made, which
foreign commits it repairs, a unique id of the commit attempt (``mvsink.commit``), and the
definition id of the replica's view (``mvsink.definition``, :mod:`mvsink.definition`).

The fence (:mod:`mvsink.append.fence`) is part of the compare: a shard with a fence commits only
on a snapshot whose fence (a table property) is its own definition, checked on the snapshot the
commit is based on. A promoted replica whose definition does not hold the fence first raises it,
with a commit of its own (reason ``fence``: the property set, the txn kept where it is), then
appends; a replica fenced out raises :class:`~mvsink.append.fence.Fenced` and commits nothing,
deleting its staged files first as a lost race does (unless one of its attempts landed).

A compaction (:mod:`mvsink.append.compact`) commits through the same path: it keeps the txn where
it is (`lower == upper`), so it too conflicts with every concurrent commit of the view.

On object stores a request can fail transiently, and a commit can land while its reply is lost:
the client then sees an error (or, retrying the conditional PUT, a conflict with itself). So a
failed attempt is never taken at its word: the log is read again, and if the txn has moved past
`lower` by a commit carrying one of this append's attempt ids, the append *did* land and is
reported as appended; its files are kept. Transient errors are retried with bounded backoff
(:func:`mvsink.storage.retrying`); once the attempts are used up the append raises
:class:`AppendError` and keeps the staged files (a later read-back or cleanup settles them).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from mvsink import failpoints, storage, table as delta_table
from mvsink.append import log_entry
from mvsink.append.fence import Fence, Fenced, fence_of, fence_property
from mvsink.target.commit_info import (META_VIEW, META_REPLICA, META_LOWER, META_UPPER, META_REASON,
                                       META_REPAIRS, META_COMMIT, META_SINCE, META_DEFINITION,
                                       REASON_ADVANCE_UPPER, REASON_FENCE)
from mvsink.target.guard import UpperHistory, check_supported
from mvsink.mint import Description
from mvsink.write import StagedBatch

log = logging.getLogger(__name__)

_MAX_FOREIGN_CONFLICTS = 20


class AppendError(RuntimeError):
    """An append could not be completed (the object store kept failing, or conflicts never ended)."""


@dataclass(frozen=True)
class AppendResult:
    appended: bool
    #: The view's upper after the attempt: `desc.upper` if appended, else what won.
    upper: int
    #: The ids (``mvsink.commit``) this append's commit attempts carried: if appended, one of
    #: them is in the log (:meth:`mvsink.correction.readback.ReadBack.adopt` finds it).
    commit_ids: frozenset[str] = frozenset()
    #: Not appended because the batch rewrites files the table no longer holds (see the module doc).
    stale: bool = False


class Shard:
    """The target table as seen by one view: its upper, and the commits that move it."""

    def __init__(self, target: str, app_id: str, view_id: str, replica_id: str, failpoint_prefix: str = ""):
        self.target = target
        self.app_id = app_id
        self.view_id = view_id
        self.replica_id = replica_id
        #: Prefix of the failpoints its appends hit (``before-commit``, ``after-commit``).
        self.failpoint_prefix = failpoint_prefix
        self.history = UpperHistory(target, app_id, view_id)
        #: Which definition may write (:mod:`mvsink.append.fence`); None: no fencing (tests that
        #: drive a shard directly).
        self.fence: Fence | None = None
        #: Whether the target may have deletion vectors (the guard refuses them otherwise).
        self.deletion_vectors = False

    def table(self, version: int | None = None) -> DeltaTable:
        """The table (latest, checked by the guard; or at ``version``), loaded with retries on
        transient errors."""
        table = storage.retrying(
            f"loading {self.target}", DeltaTable, storage.delta_uri(self.target), version=version,
            storage_options=storage.storage_options(self.target))
        if version is None:
            check_supported(table, self.target, self.deletion_vectors)
            self.observe_fence(table)
        return table

    def observe_fence(self, table: DeltaTable) -> None:
        """Hold the latest snapshot ``table`` against the fence (:meth:`Fence.observe`), again
        for a snapshot already loaded: whether this replica writes may have changed since."""
        if self.fence is not None:
            self.fence.observe(table)

    def upper_of(self, table: DeltaTable) -> int:
        """The upper in ``table``'s snapshot; never below one this shard has seen or found recorded."""
        return self.history.check(table.transaction_version(self.app_id) or 0, table.version())

    def upper(self) -> int:
        return self.upper_of(self.table())

    def verified_upper(self) -> int:
        """The upper, after reading the log back to the last commit that set the view's txn: it
        must be the view's own, and the upper cannot be below what it recorded (see the guard).
        The log read stops at the first entry gone (cleaned up behind a checkpoint)."""
        table = self.table()
        for version in range(table.version(), -1, -1):
            try:
                actions = storage.retrying(f"reading version {version} of {self.target}",
                                           delta_table.log_actions, self.target, version)
            except FileNotFoundError:
                break
            if any("txn" in a and a["txn"].get("appId") == self.app_id for a in actions):
                self.history.record(version, actions)
                break
        return self.upper_of(table)

    def landed(self, table: DeltaTable, since_version: int, commit_ids: set[str]) -> int | None:
        """The version after ``since_version`` of a commit carrying one of ``commit_ids``, if any.

        Up to ``table``'s version, read from the log entries themselves: delta-rs' history also
        returns commits newer than the snapshot, numbered from the snapshot's version, so its
        version numbers are off when a commit lands meanwhile.
        """
        if not commit_ids:
            return None
        for version in range(since_version + 1, table.version() + 1):
            if self.commit_info(version).get(META_COMMIT) in commit_ids:
                return version
        return None

    def commit_info(self, version: int) -> dict:
        """The commit info of table ``version`` (empty if it has none)."""
        return storage.retrying(f"reading version {version} of {self.target}", delta_table.commit_info,
                                self.target, version)

    def commit(self, table: DeltaTable, lower: int, upper: int, reason: str,
               files: list | None = None, repairs: list[int] | None = None,
               commit_id: str | None = None, removes: list[tuple[str, int]] | None = None,
               data_change: bool = True, since: int | None = None, extra: dict | None = None,
               removed_deletion_vectors: dict[str, dict] | None = None, marked: list[dict] | None = None) -> str:
        """One commit based on ``table``'s snapshot moving the txn from `lower` to `upper`.

        It adds ``files`` (staged files) and ``marked`` (add actions as the log holds them, files
        of ``removes`` under new deletion vectors) and removes ``removes`` (`(path, size)` of files
        in the snapshot; ``removed_deletion_vectors``: the vector each has, where it has one);
        ``data_change=False`` marks both as a rearrangement that changes no contents.
        ``since`` is recorded as :data:`META_SINCE`, ``extra`` (``mvsink.*`` keys) as given. Returns
        the commit's id (``mvsink.commit``).
        """
        if self.fence is not None:
            self.fence.check(table)
        commit_id = commit_id or uuid.uuid4().hex
        now = int(time.time() * 1000)
        actions = [
            RemoveAction(path=path, data_change=data_change, deletion_timestamp=now, size=size,
                         partition_values={})
            for path, size in removes or []
        ]
        actions += [
            AddAction(path=f.path, size=f.size, partition_values={}, modification_time=now,
                      data_change=data_change, stats=f.stats)
            for f in files or []
        ]
        metadata = {
            META_VIEW: self.view_id, META_REPLICA: self.replica_id, META_LOWER: lower,
            META_UPPER: upper, META_REASON: reason, META_REPAIRS: sorted(repairs or []),
            META_COMMIT: commit_id,
        }
        if since is not None:
            metadata[META_SINCE] = since
        metadata.update(extra or {})
        if removed_deletion_vectors or marked:
            self._commit_own_entry(table, upper, now, metadata, files or [], removes or [],
                                   removed_deletion_vectors or {}, marked or [], data_change)
            return commit_id
        table.create_write_transaction(
            actions, mode="append", schema=table.schema(),
            commit_properties=self._commit_properties(metadata, upper, now),
        )
        return commit_id

    def _commit_own_entry(self, table: DeltaTable, upper: int, now: int, metadata: dict, files: list,
                          removes: list[tuple[str, int]], deletion_vectors: dict[str, dict], marked: list[dict],
                          data_change: bool) -> None:
        """The commit :meth:`commit` describes, as a log entry of mvsink's own
        (:mod:`mvsink.append.log_entry`): a ``remove`` of a file with a deletion vector must name
        it, and delta-rs's actions cannot. Version ``table.version() + 1``, created only if absent:
        a version another writer took raises ``CommitFailedError``, as delta-rs's conflict does."""
        if self.fence is not None:
            metadata = {**metadata, META_DEFINITION: self.fence.definition}
        actions: list[dict] = [log_entry.txn_action(self.app_id, upper, now)]
        for path, size in removes:
            remove = {"path": path, "deletionTimestamp": now, "dataChange": data_change, "size": size,
                      "extendedFileMetadata": True, "partitionValues": {}}
            if path in deletion_vectors:
                remove["deletionVector"] = deletion_vectors[path]
            actions.append({"remove": remove})
        actions += [{"add": {"path": f.path, "size": f.size, "partitionValues": {}, "modificationTime": now,
                             "dataChange": data_change, "stats": f.stats}} for f in files]
        actions += [{"add": {**add, "modificationTime": now, "dataChange": data_change}} for add in marked]
        version = table.version() + 1
        info = {"operation": "WRITE", "operationParameters": {"mode": "Append"}, **metadata}
        if not log_entry.commit_entry(self.target, version, actions, info):
            raise CommitFailedError(f"version {version} of {self.target} was committed by another writer")

    def holds(self, table: DeltaTable, files: list[tuple[str, int]], deletion_vectors: dict[str, dict]) -> bool:
        """Whether ``table``'s snapshot holds every one of ``files``; where the target may have
        deletion vectors, each as the same logical file: with the vector it had
        (``deletion_vectors``), or still none (a vector added since is a change the batch did not see)."""
        if not self.deletion_vectors:
            present = set(table.get_add_actions(flatten=True).column("path").to_pylist())
            return all(path in present for path, _ in files)
        live = storage.retrying(f"listing the files of {self.target}", delta_table.live_files, self.target,
                                table.version())
        return all(path in live and live[path].get("deletionVector") == deletion_vectors.get(path)
                   for path, _ in files)

    def raise_fence(self, table: DeltaTable, upper: int) -> str:
        """One commit based on ``table``'s snapshot that sets the fence to this shard's definition,
        keeping the txn at ``upper`` (the snapshot's): a metadata change, so every concurrent
        commit conflicts with it, and it with them. Returns its id."""
        commit_id = uuid.uuid4().hex
        metadata = {META_VIEW: self.view_id, META_REPLICA: self.replica_id, META_LOWER: upper,
                    META_UPPER: upper, META_REASON: REASON_FENCE, META_REPAIRS: [], META_COMMIT: commit_id}
        was = fence_of(table, self.view_id)  # read first: the alter updates ``table`` in place
        table.alter.set_table_properties(
            {fence_property(self.view_id): self.fence.definition}, raise_if_not_exists=False,
            commit_properties=self._commit_properties(metadata, upper, int(time.time() * 1000)))
        self.fence.held = True
        log.warning("view %s: definition %s raised the fence of %s at upper %d (was %s)", self.view_id,
                    self.fence.definition, self.target, upper, was or "none")
        return commit_id

    def _commit_properties(self, metadata: dict, upper: int, now: int) -> CommitProperties:
        if self.fence is not None:
            metadata = {**metadata, META_DEFINITION: self.fence.definition}
        return CommitProperties(
            custom_metadata=metadata,
            app_transactions=[Transaction(app_id=self.app_id, version=upper, last_updated=now)],
        )


def compare_and_append(shard: Shard, desc: Description, batch: StagedBatch | None,
                       reason: str, repairs: list[int] | None = None,
                       extra: dict | None = None) -> AppendResult:
    """Commit ``batch`` (None: no data, only progress) as `[lower, upper)`; see the module doc.

    ``extra`` is more commit info (``mvsink.*`` keys) for the commit of ``batch``."""
    files = batch.files if batch else []  # error files are listed by the commit info, not added
    removes = batch.removes if batch else []
    removed_deletion_vectors = batch.removed_deletion_vectors if batch else {}
    marked = batch.marked if batch else []
    foreign_conflicts = 0
    transient_failures = 0
    #: Ids of this append's commit attempts, and the table version the first was based on: a
    #: commit carrying one of these ids after that version is this append, landed.
    attempt_ids: set[str] = set()
    based_on: int | None = None
    while True:
        try:
            table = shard.table()
            current = shard.upper_of(table)
            if current > desc.lower and attempt_ids:
                version = shard.landed(table, based_on, attempt_ids)
                if version is not None:
                    log.warning("appended %s at version %d: the commit landed though its reply was "
                                "lost", desc, version)
                    return AppendResult(True, desc.upper, frozenset(attempt_ids))
            if current <= desc.lower and shard.fence is not None and shard.fence.must_raise(table):
                shard.raise_fence(table, current)
                continue
            if current < desc.lower:
                log.info("upper %d is behind %s: advancing it first", current, desc)
                shard.commit(table, current, desc.lower, REASON_ADVANCE_UPPER)
                continue
            if current > desc.lower:
                break
            if removes and not shard.holds(table, removes, removed_deletion_vectors):
                log.info("%s is stale: files it rewrites were removed meanwhile", desc)
                batch.delete()
                return AppendResult(False, current, stale=True)
            failpoints.hit(shard.failpoint_prefix + "before-commit")
            commit_id = uuid.uuid4().hex
            attempt_ids.add(commit_id)
            based_on = table.version() if based_on is None else based_on
            shard.commit(table, desc.lower, desc.upper, reason, files, repairs, commit_id, removes=removes,
                         extra=extra, removed_deletion_vectors=removed_deletion_vectors, marked=marked)
            failpoints.hit(shard.failpoint_prefix + "after-commit")
            log.info("appended %s: %d files, %d updates (%s)", desc, len(files),
                     batch.num_records if batch else 0, reason)
            return AppendResult(True, desc.upper, frozenset(attempt_ids))
        except CommitFailedError as exc:
            # A commit landed after our snapshot: another replica moved the upper, our own attempt
            # landed and its reply was lost (the next loop finds either), or a foreign writer
            # conflicted (retry, bounded).
            foreign_conflicts += 1
            if foreign_conflicts > _MAX_FOREIGN_CONFLICTS:
                raise AppendError(f"append of {_span(desc)} to {shard.target} kept conflicting: {exc}") from exc
            log.debug("commit of %s conflicted (%s); re-reading the upper", desc, exc)
        except storage.StorageUnavailable as exc:
            raise AppendError(
                f"append of {_span(desc)} to {shard.target} failed, the object store kept failing: "
                f"{storage.describe(exc)}; "
                f"nothing committed is lost, the staged files are kept until a read-back or cleanup "
                f"settles them") from exc
        except Fenced:
            # This replica never commits again: a staged batch none of its attempts landed is
            # no one's; delete it now, as a lost race does, rather than leave it to cleanup.
            if batch and not _any_landed(shard, based_on, attempt_ids):
                batch.delete()
            raise
        except Exception as exc:
            if not storage.is_transient(exc):
                raise
            transient_failures += 1
            if transient_failures >= storage.attempts():
                raise AppendError(
                    f"append of {_span(desc)} to {shard.target} failed after {transient_failures} "
                    f"attempts, the object store kept failing: {storage.describe(exc)}; nothing "
                    f"committed is lost, the staged "
                    f"files are kept until a read-back or cleanup settles them") from exc
            wait = storage.backoff()(_RetryState(transient_failures))
            log.warning("append of %s failed (attempt %d of %d), retrying in %.1fs: %s", _span(desc),
                        transient_failures, storage.attempts(), wait, storage.describe(exc))
            time.sleep(wait)
    log.info("lost %s: the upper is already %d", desc, current)
    if batch:
        batch.delete()
    return AppendResult(False, current)


def _any_landed(shard: Shard, based_on: int | None, attempt_ids: set[str]) -> bool:
    """Whether a commit attempt of ``attempt_ids`` (based on version ``based_on``) is in the
    table, read without holding it against the fence."""
    if based_on is None:
        return False
    return shard.landed(shard.table(delta_table.latest_version(shard.target)), based_on, attempt_ids) is not None


def _span(desc: Description) -> str:
    return f"[{desc.lower}, {desc.upper})"


class _RetryState:
    """The little of tenacity's retry state its wait strategies read."""

    def __init__(self, attempt_number: int):
        self.attempt_number = attempt_number
