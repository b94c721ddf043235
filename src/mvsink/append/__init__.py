"""`append`: commits a staged batch with compare-and-append on the view's Delta ``txn`` version.

The view's *upper* is the version of the Delta application transaction (``txn`` action) whose
appId is the view's (:attr:`ViewDefinition.app_id`); a table without it has upper 0. A batch for
`[lower, upper)` is one Delta commit that adds the staged files and sets the txn to `upper`, made
only if the txn is `lower` in the snapshot the commit is based on.

Why this is a compare-and-append: the commit goes through delta-rs, which writes the log entry
with put-if-absent (a hard link on local filesystems, a conditional PUT on S3), and fails with
``CommitFailedError`` when a commit that landed after its base snapshot carried a txn with the
same appId. Every mvsink commit carries that txn, so of two replicas that read the same upper at
most one commits; commits by foreign writers (no txn) do not conflict and are corrected later.

Outcomes:

* the upper is `lower`: commit, the upper becomes `upper`;
* the upper is behind `lower` (a first write at ``as_of``): first move it to `lower` with an empty
  commit, then append;
* the upper is past `lower` (another replica won): delete the staged files and report the upper;
  the winner's updates reach the correction buffer through read-back.

Every commit records in its commit info: view, replica, lower, upper, why it was made, and which
foreign commits it repairs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, Transaction

from mvsink import failpoints, storage
from mvsink.mint import Description
from mvsink.write import StagedBatch

log = logging.getLogger(__name__)

#: Commit-info keys, all prefixed so they cannot clash with Delta's own.
META_VIEW = "mvsink.view"
META_REPLICA = "mvsink.replica"
META_LOWER = "mvsink.lower"
META_UPPER = "mvsink.upper"
META_REASON = "mvsink.reason"
META_REPAIRS = "mvsink.repairs"

REASON_CORRECTION = "correction"
REASON_REPAIR = "repair"
REASON_PROGRESS = "progress"
REASON_ADVANCE_UPPER = "advance-upper"

_MAX_FOREIGN_CONFLICTS = 20


@dataclass(frozen=True)
class AppendResult:
    appended: bool
    #: The view's upper after the attempt: `desc.upper` if appended, else what won.
    upper: int


class Shard:
    """The target table as seen by one view: its upper, and the commits that move it."""

    def __init__(self, target: str, app_id: str, view_id: str, replica_id: str):
        self.target = target
        self.app_id = app_id
        self.view_id = view_id
        self.replica_id = replica_id

    def table(self, version: int | None = None) -> DeltaTable:
        return DeltaTable(storage.delta_uri(self.target), version=version,
                          storage_options=storage.storage_options(self.target))

    def upper_of(self, table: DeltaTable) -> int:
        return table.transaction_version(self.app_id) or 0

    def upper(self) -> int:
        return self.upper_of(self.table())

    def commit(self, table: DeltaTable, lower: int, upper: int, reason: str,
               files: list | None = None, repairs: list[int] | None = None) -> None:
        """One commit based on ``table``'s snapshot moving the txn from `lower` to `upper`."""
        now = int(time.time() * 1000)
        actions = [
            AddAction(path=f.path, size=f.size, partition_values={}, modification_time=now,
                      data_change=True, stats=f.stats)
            for f in files or []
        ]
        metadata = {
            META_VIEW: self.view_id, META_REPLICA: self.replica_id, META_LOWER: lower,
            META_UPPER: upper, META_REASON: reason, META_REPAIRS: sorted(repairs or []),
        }
        table.create_write_transaction(
            actions, mode="append", schema=table.schema(),
            commit_properties=CommitProperties(
                custom_metadata=metadata,
                app_transactions=[Transaction(app_id=self.app_id, version=upper, last_updated=now)],
            ),
        )


def compare_and_append(shard: Shard, desc: Description, batch: StagedBatch | None,
                       reason: str, repairs: list[int] | None = None) -> AppendResult:
    """Commit ``batch`` (None: no data, only progress) as `[lower, upper)`; see the module doc."""
    files = batch.files if batch else []
    foreign_conflicts = 0
    while True:
        table = shard.table()
        current = shard.upper_of(table)
        try:
            if current < desc.lower:
                log.info("upper %d is behind %s: advancing it first", current, desc)
                shard.commit(table, current, desc.lower, REASON_ADVANCE_UPPER)
                continue
            if current > desc.lower:
                break
            failpoints.hit("before-commit")
            shard.commit(table, desc.lower, desc.upper, reason, files, repairs)
            failpoints.hit("after-commit")
            log.info("appended %s: %d files, %d updates (%s)", desc, len(files),
                     batch.num_records if batch else 0, reason)
            return AppendResult(True, desc.upper)
        except CommitFailedError as exc:
            # A commit landed after our snapshot: either another replica moved the upper (the
            # next loop sees it and gives up) or a foreign writer conflicted (retry, bounded).
            foreign_conflicts += 1
            if foreign_conflicts > _MAX_FOREIGN_CONFLICTS:
                raise RuntimeError(f"append of {desc} kept conflicting: {exc}") from exc
            log.debug("commit of %s conflicted (%s); re-reading the upper", desc, exc)
    log.info("lost %s: the upper is already %d", desc, current)
    if batch:
        batch.delete()
    return AppendResult(False, current)
