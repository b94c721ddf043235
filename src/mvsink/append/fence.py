"""The fence: which definition of a view may write its target, recorded in the table and checked
inside every compare-and-append.

A view's versions are told apart by their definition id (:mod:`mvsink.definition`). The target
records the definition currently allowed to write, the *fence*, as the table property
``mvsink.fence.<view id>``: every snapshot shows it. The table is created with its creator's
definition as the fence; a table written before fences existed has none until its first commit
by a fencing replica, which raises it.

Who may commit (:class:`Fence`, one per replica of a view):

* a read-only replica commits nothing and is never fenced; it computes whatever the fence is;
* a replica *started as a writer* (without ``--read-only``) may commit only on snapshots whose
  fence is its own definition (on a table with none, its first append raises it). Started on a
  table fenced for another definition it refuses (:class:`DefinitionRefused`), nothing written;
* a replica *promoted* (started read-only, then allowed to write: a cutover; a view created on
  a replica so promoted too) may raise the fence to its own definition: its first append first
  makes a commit of its own (reason ``fence``) that sets the property, then appends;
* a writing replica that finds the fence held by another definition after it held it itself (or
  without having been promoted) is *fenced* (:class:`Fenced`): it never writes again.

Why an older definition cannot write after the newer one's first commit, even paused across the
cutover: the fence is raised by a commit (a metadata action setting the property) that also
carries the view's ``txn``, so with delta-rs' conflict checks any commit based on a snapshot from
before it fails (``CommitFailedError``: metadata changed, or the same appId committed); the loser
re-reads the table, and every commit mvsink makes checks the fence of the very snapshot it is
based on (:meth:`Fence.check`), so the re-read finds the new fence and stops. A commit can only
land on a snapshot whose fence is the committer's own definition.

Replicas of one definition share the fence and keep writing together. A promoted replica raises
the fence once; two promoted definitions racing end with the last raise winning and the other
fenced (each raises at most once), never a fight.
"""

from __future__ import annotations

import logging

from deltalake import DeltaTable

from mvsink.view import ConfigError

log = logging.getLogger(__name__)

#: Prefix of the table property holding a view's fence (its value is a definition id).
FENCE_PROPERTY = "mvsink.fence."

#: How to hand over from one definition to another, for the errors.
CUTOVER = ("to cut over to a new definition, start its replicas with --read-only, let them catch "
           "up, then allow writes (AllowWrites from a controller, SIGUSR1, or --allow-writes-file); "
           "its first commit fences the old definition's replicas")


def fence_property(view_id: str) -> str:
    return FENCE_PROPERTY + view_id


def initial_properties(view, schema) -> dict[str, str]:
    """The table properties a target of ``view`` (a :class:`~mvsink.view.ViewDefinition` whose
    output schema is ``schema``) is created with: fenced for its creator's definition."""
    from mvsink.definition import definition_id

    return {fence_property(view.view_id): definition_id(view, schema)}


def fence_of(table: DeltaTable, view_id: str) -> str | None:
    """The definition id the snapshot ``table`` allows to write view ``view_id`` (None: no fence)."""
    return table.metadata().configuration.get(fence_property(view_id))


class Fenced(ConfigError):
    """Another definition of the view holds the fence: this replica never writes again."""


class DefinitionRefused(Fenced):
    """A replica started as a writer (not read-only) on a table fenced for another definition."""


class FenceNotRaised(RuntimeError):
    """A commit other than an append's (a compaction) on a snapshot whose fence is not yet this
    replica's: it waits for the append that raises it."""


class Fence:
    """One replica's standing towards its view's fence (see the module doc)."""

    def __init__(self, uri: str, view_id: str, definition: str, replica_id: str):
        self.uri, self.view_id, self.definition, self.replica_id = uri, view_id, definition, replica_id
        #: Writes allowed (a read-only replica is never fenced).
        self.writing = False
        #: Allowed by a cutover: may raise the fence over another definition, until it held it.
        self.may_raise = False
        #: This replica has seen its own definition as the fence (or raised it).
        self.held = False
        #: Why this replica is fenced, once it is (for good).
        self.reason: str | None = None

    @property
    def fenced(self) -> bool:
        return self.reason is not None

    def allow_writes(self, table: DeltaTable | None, cutover: bool) -> None:
        """Writes are allowed: by a cutover (``cutover``: may raise the fence), or because the
        replica was started as a writer, which ``table`` (the latest snapshot, None: no table
        yet) must then be fenced for, or not at all (:class:`DefinitionRefused` if not)."""
        if self.reason is not None:
            raise Fenced(self.reason)
        if self.writing:
            return
        current = fence_of(table, self.view_id) if table is not None else None
        if not cutover and current not in (None, self.definition):
            self._fence(DefinitionRefused, (
                f"view {self.view_id!r}: replica {self.replica_id} has definition {self.definition}, but "
                f"{self.uri} is written by definition {current} (table version {table.version()}, "
                f"property {fence_property(self.view_id)}); a replica started without --read-only "
                f"writes only its table's current definition, so it writes nothing; {CUTOVER}"))
        self.writing, self.may_raise = True, cutover
        if current == self.definition:
            self.held = True

    def observe(self, table: DeltaTable) -> str | None:
        """The fence of the snapshot ``table``; fences this replica (:class:`Fenced`) if it writes
        and another definition holds the fence that it may not take over."""
        if self.reason is not None:
            raise Fenced(self.reason)
        current = fence_of(table, self.view_id)
        if current == self.definition:
            self.held = True
        elif current is not None and self.writing and (self.held or not self.may_raise):
            how = "after it held it" if self.held else "and it was not promoted by a cutover"
            self._fence(Fenced, (
                f"view {self.view_id!r}: replica {self.replica_id} (definition {self.definition}) is fenced: "
                f"{self.uri} is written by definition {current} since table version {table.version()} or "
                f"earlier ({how}); it never writes again. Stop it; to run this definition again, start it "
                f"--read-only and allow writes (a cutover back)"))
        return current

    def _fence(self, error: type[Fenced], reason: str) -> None:
        """Fence this replica for good, for ``reason``: log it, raise ``error``."""
        self.reason = reason
        log.error("%s", reason)
        raise error(reason)

    def must_raise(self, table: DeltaTable) -> bool:
        """Before a commit based on ``table``'s snapshot: whether the fence must first be raised
        to this replica's definition (it is another's, or none); :class:`Fenced` if this
        replica may not write on it."""
        if not self.writing:
            raise Fenced(f"view {self.view_id!r}: replica {self.replica_id} is read-only and commits nothing")
        return self.observe(table) != self.definition

    def check(self, table: DeltaTable) -> None:
        """Every commit's check: it is based on ``table``'s snapshot, whose fence must be this
        replica's definition."""
        if self.must_raise(table):
            raise FenceNotRaised(f"view {self.view_id!r}: replica {self.replica_id} would commit on table version "
                         f"{table.version()}, whose fence is {fence_of(table, self.view_id)}, not its "
                         f"definition {self.definition}; an append raises the fence first")
