"""How large a step's change is against its sources, read from their Delta logs (no Spark job).

A step of a query view reads the changes of the sources whose versions move and, for a join, the
other sides where those changes join them; a full evaluation reads every source whole. What each
costs follows the bytes it reads, so ``refresh: auto`` weighs the *change share*: the bytes of the
data files the changes are read from (each commit's change data files, or, where a commit has
none, the data files it added and removed: :func:`mvsink.table.change_data_bytes`) over the bytes
of the data files of every source the query reads, at the versions after. It is known before any
of the step's Spark work, from the logs alone.

Invariant: the share is None, never a guess, where some size is not in a log (an older writer's
``remove`` may leave it out), a commit file is gone, or a table cannot be listed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from deltalake import DeltaTable

from mvsink import storage
from mvsink.table import change_data_bytes

log = logging.getLogger(__name__)

#: Commits per source and step whose sizes are read (more: the share is not computed).
MOST_COMMITS = 1000


@lru_cache(maxsize=256)
def source_bytes(uri: str, version: int) -> int | None:
    """The bytes of the data files of the table at ``uri`` at ``version`` (a version's files never
    change, so the answer is kept); None where delta-rs cannot list them."""
    try:
        table = DeltaTable(storage.delta_uri(uri), version=version, storage_options=storage.storage_options(uri))
        sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    except Exception as exc:
        log.debug("table %s at version %d: its size is not known (%s)", uri, version, exc)
        return None
    return sum(size or 0 for size in sizes)


@dataclass(frozen=True)
class ChangeSize:
    """A step's change in bytes (``changed``) against the bytes of the sources the query reads
    after it (``sources``)."""

    changed: int
    sources: int

    @property
    def share(self) -> float:
        return self.changed / self.sources if self.sources else 0.0


def change_size(sources: dict[str, str], moved: dict[str, tuple[int, int]], after: dict[str, int],
                size: Callable[[str, int], int | None] | None = None) -> ChangeSize | None:
    """The change's bytes and the sources' bytes: ``moved`` maps each source whose version moves
    to its first and last changed versions, ``after`` every source the query reads to its version
    after the change, ``sources`` each to its URI; ``size(name, version)`` gives a source's bytes
    (by default :func:`source_bytes`). None where a size is not known."""
    total = 0
    for name, version in after.items():
        bytes_ = size(name, version) if size is not None else source_bytes(sources[name], version)
        if bytes_ is None:
            return None
        total += bytes_
    changed = 0
    for name, (first, last) in moved.items():
        bytes_ = change_data_bytes(sources[name], first, last, MOST_COMMITS)
        if bytes_ is None:
            return None
        changed += bytes_
    return ChangeSize(changed, total)
