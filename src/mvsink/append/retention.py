"""Retention: how much of a view's history its table keeps, and the upkeep that holds it there.

In the table layout (:mod:`mvsink.target.layout`) the table's history is Delta's own versions, kept as
Delta's log and ``VACUUM`` retention keep them; there the compaction rewrites small files into
fewer (:func:`~mvsink.append.compact.compact_files`) once the table holds more than
:data:`COMPACT_SMALL_FILES` small data files or error files, or a file whose deletion vector
deletes a good share of its rows (:func:`~mvsink.append.compact.worn_files`), so that a reader opens
and reads about as much as a plain table of the same rows has; ``retain_history`` gives up nothing.
In the update layout a view declares ``retain_history``: a duration (``90s``, ``30m``, ``1h``, ``7d``), a number of
times (``100``), or ``all``. Default: :data:`DEFAULT`. From it a writing replica derives the since
it may compact to:

* a number `n`: the latest `n` times stay readable, `since = upper - n`;
* a duration `d`: every time that was current within `d` stays readable, `since` is the latest
  time minted at or before `now - d` on the timeline (the view as it was `d` ago);
* ``all``: nothing is given up.

The since never goes below ``as_of`` and only moves forward (:mod:`mvsink.append.compact`).

:class:`Upkeep` runs after a writer's step: it compacts (through the same compare-and-append
path as every commit); in the update layout once the table holds :data:`COMPACT_AFTER_FILES` more
data files than after the last compaction and the since can move, so a long run holds about the view plus the retained
changes; and it writes a Delta checkpoint of the target and of the timeline every
``delta.checkpointInterval`` versions (default 10), since delta-rs commits do not. A failed compaction or checkpoint is logged and tried again
later: upkeep never fails a step.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass

from deltalake import DeltaTable

from mvsink import storage
from mvsink.append.compact import compact, compact_files, small_files, worn_files
from mvsink.target.layout import TABLE
from mvsink.view import ConfigError

log = logging.getLogger(__name__)

DEFAULT = "1h"
#: Compact once the table has this many more data files than after the last compaction.
COMPACT_AFTER_FILES = 50
#: Table layout: compact once the table has more small data files (or error files) than this.
COMPACT_SMALL_FILES = 4
_CHECKPOINT_INTERVAL = 10
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d)\s*$")


@dataclass(frozen=True)
class Retention:
    """``times``: keep that many times; ``seconds``: keep that much wall-clock history; neither:
    keep everything."""

    times: int | None = None
    seconds: int | None = None

    @staticmethod
    def parse(value) -> "Retention":
        """From ``retain_history``: an int or digit string (times), a duration, or ``all``."""
        if value is None:
            value = DEFAULT
        if isinstance(value, bool):
            raise ConfigError(f"retain_history must be a duration (30m, 1h, 7d), a number of times or 'all', "
                              f"not {value!r}")
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            times = int(value)
            if times < 1:
                raise ConfigError(f"retain_history must keep at least 1 time, not {value!r}")
            return Retention(times=times)
        if isinstance(value, str) and value.strip().lower() == "all":
            return Retention()
        match = _DURATION.match(value) if isinstance(value, str) else None
        if match is None:
            raise ConfigError(f"retain_history must be a duration (30m, 1h, 7d), a number of times or 'all', "
                              f"not {value!r}")
        return Retention(seconds=int(match.group(1)) * _UNITS[match.group(2)])

    def since(self, upper: int, as_of: int, timeline, now_ms: int | None = None) -> int:
        """The since this retention allows for a view at ``upper`` on ``timeline``."""
        if self.times is not None:
            return max(as_of, upper - self.times)
        if self.seconds is not None:
            now_ms = int(time.time() * 1000) if now_ms is None else now_ms
            oldest = timeline.time_at(now_ms - self.seconds * 1000)
            return max(as_of, min(oldest, upper - 1)) if oldest is not None else as_of
        return as_of


class Upkeep:
    """Compaction to the retention's since and log checkpoints for one writing replica."""

    def __init__(self, retention: Retention):
        self.retention = retention
        #: Data files in the table after the last compaction (None: not counted yet).
        self.files_after_compaction: int | None = None
        #: Table path -> the version of its last checkpoint.
        self.checkpointed: dict[str, int] = {}
        self.compactions = 0
        self.checkpoints = 0

    def run(self, view) -> None:
        """After a step of ``view`` (a :class:`~mvsink.sink.MaterializedView` that may write)."""
        try:
            self._compact(view)
            self._checkpoint(view.shard.target)
            self._checkpoint(view.timeline.path)
        except ConfigError:
            raise
        except Exception:
            log.exception("upkeep of view %s failed; trying again later", view.view.view_id)

    def _compact(self, view) -> None:
        table = view.shard.table()
        files = len(table.file_uris())
        if self.files_after_compaction is None:
            self.files_after_compaction = files
        if view.layout == TABLE:
            if (len(small_files(table)) <= COMPACT_SMALL_FILES and len(view.readback.error_files) <= COMPACT_SMALL_FILES
                    and not worn_files(view.shard, table)):
                return
            result = compact_files(view.spark, view.shard, view.schema, view.readback.error_files, view.view.key)
        elif files < self.files_after_compaction + COMPACT_AFTER_FILES:
            return
        else:
            upper = view.shard.upper_of(table)
            since = self.retention.since(upper, view.view.as_of, view.timeline)
            result = compact(view.spark, view.shard, view.schema, since)
        self.files_after_compaction = len(view.shard.table().file_uris())
        if result.version is not None:
            view.readback.adopt(frozenset({result.commit_id}), result.added, result.removed, result.error_files)
            self.compactions += 1
            log.info("view %s compacted (%s): -%d +%d files, %d files now", view.view.view_id,
                     "small files" if view.layout == TABLE else f"to since {result.since}, retain_history",
                     result.files_removed, result.files_added, self.files_after_compaction)

    def _checkpoint(self, path: str) -> None:
        table = DeltaTable(storage.delta_uri(path), storage_options=storage.storage_options(path))
        version = table.version()
        if path not in self.checkpointed:
            self.checkpointed[path] = _last_checkpoint(path)
        interval = int(table.metadata().configuration.get("delta.checkpointInterval", _CHECKPOINT_INTERVAL))
        if version - self.checkpointed[path] >= interval:
            table.create_checkpoint()
            self.checkpointed[path] = version
            self.checkpoints += 1
            log.info("checkpointed %s at version %d", path, version)


def _last_checkpoint(target: str) -> int:
    """The version of the table's last checkpoint; -1 if it has none."""
    fs, root = storage.filesystem(target)
    try:
        with fs.open_input_stream(storage.join(root, "_delta_log/_last_checkpoint")) as f:
            return int(json.loads(f.read().decode())["version"])
    except (FileNotFoundError, OSError, KeyError, ValueError):
        return -1
