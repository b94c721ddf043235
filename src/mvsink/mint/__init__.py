"""`mint`: decides the bounds `(lower, upper)` of the next batch a replica may write.

Every batch appended to a view covers a time range `[lower, upper)`: after the append the view's
upper (the Delta ``txn`` version of the view) is `upper`. The minter watches two frontiers:

* the *desired* frontier: the input is complete for all times below it;
* the *persist* frontier: the target table's upper as last read back (at least ``as_of``, so the
  first description starts at ``as_of`` or beyond and nothing before it is ever written).

Invariants:

1. The `lower`s of minted descriptions strictly increase; a `lower` is never minted twice. So at
   most one description is valid at a time and later stages only keep the latest one. The one
   exception is :meth:`Minter.abandon`: after the write or append of a description failed with an
   error, nothing of it is in flight and its `lower` may be minted again.
2. The `upper`s never decrease.
3. A description is minted only when not read-only, the desired frontier is past the persist
   frontier, and the persist frontier advanced since the last description (otherwise the last
   description is still in flight or was lost to another replica, whose commit moves the frontier).
4. Read-only mode mints nothing; ``allow_writes`` ends it for good.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Description:
    """A batch to write: corrections for times in `[lower, upper)`, appended if the upper is `lower`."""

    lower: int
    upper: int

    def __post_init__(self):
        if not self.lower < self.upper:
            raise ValueError(f"empty description [{self.lower}, {self.upper})")


class Minter:
    def __init__(self, as_of: int, read_only: bool):
        self.desired_frontier = 0
        self.persist_frontier = as_of
        self.last_lower: int | None = None
        self.read_only = read_only

    def advance_desired(self, frontier: int) -> None:
        self.desired_frontier = max(self.desired_frontier, frontier)

    def advance_persist(self, frontier: int) -> None:
        self.persist_frontier = max(self.persist_frontier, frontier)

    def allow_writes(self) -> None:
        if self.read_only:
            log.info("read-only mode ended: writes allowed")
        self.read_only = False

    def abandon(self, desc: Description) -> None:
        """Forget ``desc`` after its write or append failed, so that it can be minted again."""
        if self.last_lower == desc.lower:
            self.last_lower = None

    def maybe_mint(self) -> Description | None:
        desired_ahead = self.persist_frontier < self.desired_frontier
        persist_advanced = self.last_lower is None or self.last_lower < self.persist_frontier
        if self.read_only or not desired_ahead or not persist_advanced:
            return None
        desc = Description(self.persist_frontier, self.desired_frontier)
        self.last_lower = desc.lower
        log.debug("minted %s", desc)
        return desc
