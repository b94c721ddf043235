"""The timeline: a Delta table that maps each logical time to a version of every source.

Materialize's reclocking (its remap collection), on Delta. An *entry* says "time `t` is these
versions of these sources". Every replica of every view on a timeline computes its view at
exactly the timeline's times from exactly those versions, so replicas agree on what a time means,
a view can join several sources, and views on one timeline can be read consistently at one time.

Layout: one row per (time, source): ``time`` BIGINT, ``source`` STRING, ``version`` BIGINT,
``minted_at`` TIMESTAMP (the wall clock of the replica that appended the entry). The sources
(name -> path) are fixed when the timeline is created, in the table property ``mvsink.sources``.

Invariants:

* Times are 0, 1, 2, ...: the entry for `t` is appended by one commit that moves the timeline's
  ``txn`` (appId ``mvsink:timeline``) from `t` to `t + 1`, through the same compare-and-append as
  the sink (:func:`mvsink.append.compare_and_append`): of two replicas minting `t` exactly one
  lands, and no time is skipped or minted twice.
* Every entry holds every source, and no source's version is lower than at the time before. An
  entry may repeat the versions before it: a time minted so that a repair has a time to go to.
* Entries never change. Each commit carries its entry in its commit info (``mvsink.entry``) as
  well, so a replica reads a new entry from one small log file, not from the table's data.
* Only writing replicas extend a timeline (:meth:`Timeline.extend`); read-only ones only read it.
"""

from __future__ import annotations

import io
import json
import logging
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from mvsink import storage
from mvsink.append import Shard, compare_and_append
from mvsink.mint import Description
from mvsink.table import latest_version
from mvsink.view import ConfigError, location
from mvsink.write import StagedBatch, StagedFile
from mvsink.write.stats import FileStats

log = logging.getLogger(__name__)

APP_ID = "mvsink:timeline"
#: The shard name of timeline commits (``mvsink.view``) and of their staged files.
TIMELINE = "timeline"
META_ENTRY = "mvsink.entry"
SOURCES_PROPERTY = "mvsink.sources"
#: Why an entry was appended (``mvsink.reason`` of its commit).
REASON_SOURCES = "sources-advanced"
REASON_REPAIR_TIME = "repair-time"

SCHEMA = pa.schema([("time", pa.int64()), ("source", pa.string()), ("version", pa.int64()),
                    ("minted_at", pa.timestamp("us", tz="UTC"))])


class TimelineError(ConfigError):
    """The timeline cannot serve this view, or its entries are not a timeline's."""


class TimeWentBackwards(TimelineError):
    """Times would go backwards: a table is behind what the timeline (or a view's upper) says."""


class SourceWentBackwards(TimeWentBackwards):
    """A source's latest version is below the one a time already stands for (recreated, restored)."""


@dataclass(frozen=True)
class Entry:
    time: int
    versions: dict[str, int]
    #: Wall clock of the append, milliseconds since the epoch.
    minted_at: int


class Timeline:
    """A timeline as one replica sees it: the entries read so far, and the way to append one.

    ``sources`` is what the view declares (name -> path); an existing timeline must have exactly
    those names, for the same tables (paths compared by :func:`mvsink.view.location`). ``None`` adopts the timeline's own sources (a reader).
    """

    def __init__(self, path: str, sources: dict[str, str] | None, replica_id: str = "reader"):
        self.path = path
        self.sources = dict(sources) if sources is not None else None
        self.shard = Shard(path, APP_ID, TIMELINE, replica_id, failpoint_prefix="timeline-")
        self.entries: list[Entry] = []
        self._log_version = -1

    # -- reading ---------------------------------------------------------------------------------

    @property
    def upper(self) -> int:
        """Times below it have an entry (as of the last :meth:`refresh`)."""
        return len(self.entries)

    def exists(self) -> bool:
        return latest_version(self.path) is not None

    def refresh(self) -> int:
        """Read the entries appended since the last look; returns the upper."""
        latest = latest_version(self.path)
        if latest is None or latest == self._log_version:
            return self.upper
        if self._log_version < 0:
            self._load()
        else:
            for version in range(self._log_version + 1, latest + 1):
                info = self.shard.commit_info(version)
                if META_ENTRY in info:
                    self._add(_entry_from_json(info[META_ENTRY]), f"version {version}")
            self._log_version = latest
        return self.upper

    def versions(self, time: int) -> dict[str, int]:
        """The source versions time ``time`` stands for."""
        if time >= self.upper:
            self.refresh()
        if not 0 <= time < self.upper:
            raise ValueError(f"timeline {self.path} has times [0, {self.upper}), not {time}")
        return self.entries[time].versions

    def last(self) -> Entry | None:
        return self.entries[-1] if self.entries else None

    def time_at(self, wall_clock_ms: int) -> int | None:
        """The latest time minted at or before ``wall_clock_ms``; None if there is none."""
        self.refresh()
        times = [e.time for e in self.entries if e.minted_at <= wall_clock_ms]
        return times[-1] if times else None

    def _load(self) -> None:
        table = self.shard.table()  # refused if mvsink cannot commit to it (the guard)
        self._check_sources(table)
        upper = self.shard.upper_of(table)
        rows = table.to_pyarrow_table().to_pylist()
        by_time: dict[int, dict[str, int]] = {}
        minted: dict[int, int] = {}
        for row in rows:
            versions = by_time.setdefault(row["time"], {})
            if row["source"] in versions:
                raise TimelineError(f"timeline {self.path}: time {row['time']} has source "
                                    f"{row['source']!r} twice")
            versions[row["source"]] = row["version"]
            minted[row["time"]] = int(row["minted_at"].timestamp() * 1000) if row["minted_at"] else 0
        if sorted(by_time) != list(range(upper)):
            raise TimelineError(f"timeline {self.path}: its upper is {upper} but it holds times "
                                f"{_span(sorted(by_time))}; it was written by something other than mvsink")
        self.entries = []
        for t in range(upper):
            self._add(Entry(t, by_time[t], minted[t]), f"time {t}")
        self._log_version = table.version()

    def _check_sources(self, table: DeltaTable) -> None:
        raw = table.metadata().configuration.get(SOURCES_PROPERTY)
        if raw is None:
            raise TimelineError(f"{self.path} is a Delta table but not an mvsink timeline "
                                f"(no table property {SOURCES_PROPERTY})")
        have = json.loads(raw)
        if self.sources is None:
            self.sources = have
        elif _locations(have) != _locations(self.sources):
            raise TimelineError(
                f"timeline {self.path} is for sources {have}, but the view declares {self.sources}; "
                "every view on one timeline declares the same sources (names and tables), or give "
                "the view a timeline of its own")

    def _add(self, entry: Entry, where: str) -> None:
        if entry.time != self.upper:
            raise TimelineError(f"timeline {self.path}: {where} holds time {entry.time}, expected {self.upper}")
        if set(entry.versions) != set(self.sources or {}):
            raise TimelineError(f"timeline {self.path}: time {entry.time} has sources "
                                f"{sorted(entry.versions)}, the timeline's are {sorted(self.sources or {})}")
        previous = self.last()
        if previous is not None:
            back = {s: (previous.versions[s], v) for s, v in entry.versions.items() if v < previous.versions[s]}
            if back:
                raise TimelineError(f"timeline {self.path}: at time {entry.time} source versions went "
                                    f"back: {back}")
        self.entries.append(entry)

    # -- extending -------------------------------------------------------------------------------

    def extend(self, versions: dict[str, int], reason: str, at: int) -> bool:
        """Append the entry for time ``at`` with ``versions``, by compare-and-append.

        ``at`` is the upper the caller decided on. Returns whether this call appended the entry;
        False if another replica minted ``at`` first (before or during this call): its entry is
        read instead, and the caller decides again, on the new entries, whether a time is still
        needed (its ``versions`` may be older than what the other replica saw).
        """
        if set(versions) != set(self.sources or {}):
            raise TimelineError(f"timeline {self.path}: an entry needs versions of {sorted(self.sources)}, "
                                f"not {sorted(versions)}")
        self._create_if_missing()
        time_ = self.refresh()
        if time_ != at:
            return False
        self.check_not_behind(versions)
        entry = Entry(time_, dict(versions), int(time.time() * 1000))
        batch = self._stage(entry)
        result = compare_and_append(self.shard, Description(time_, time_ + 1), batch, reason,
                                    extra={META_ENTRY: _entry_to_json(entry)})
        self.refresh()
        if result.appended:
            log.info("timeline %s: minted time %d = %s (%s)", self.path, time_, versions, reason)
        return result.appended

    def check_not_behind(self, versions: dict[str, int]) -> None:
        """Raise :class:`SourceWentBackwards` if a source's ``versions`` is below the latest time's."""
        previous = self.last()
        if previous is None:
            return
        back = {s: (previous.versions[s], v) for s, v in versions.items() if v < previous.versions[s]}
        if back:
            raise SourceWentBackwards(
                f"timeline {self.path}: time {previous.time} stands for "
                + ", ".join(f"version {a} of source {s} ({self.sources[s]}), which is now at {b}"
                            for s, (a, b) in back.items())
                + "; was a source recreated or restored to an older version? Give the view a new "
                "timeline and target to start over")

    def _create_if_missing(self) -> None:
        if self.exists():
            if not self.entries and self._log_version < 0:
                self.refresh()
            return
        try:
            DeltaTable.create(storage.delta_uri(self.path), schema=SCHEMA, mode="ignore", name=TIMELINE,
                              description="mvsink timeline: time -> version of every source",
                              configuration={SOURCES_PROPERTY: json.dumps(self.sources, sort_keys=True)},
                              storage_options=storage.storage_options(self.path),
                              raise_if_key_not_exists=False)
            log.info("created timeline %s for sources %s", self.path, self.sources)
        except Exception:
            if not self.exists():
                raise
        self.refresh()

    def _stage(self, entry: Entry) -> StagedBatch:
        names = sorted(entry.versions)
        data = pa.table({
            "time": [entry.time] * len(names), "source": names,
            "version": [entry.versions[n] for n in names],
            "minted_at": pa.array([entry.minted_at * 1000] * len(names), pa.timestamp("us", tz="UTC")),
        }, schema=SCHEMA)
        buffer = io.BytesIO()
        pq.write_table(data, buffer)
        name = f"mvsink-{TIMELINE}-{entry.time}-{entry.time + 1}-{self.shard.replica_id}-{uuid.uuid4().hex[:12]}.parquet"
        fs, root = storage.filesystem(self.path)

        def put():
            with fs.open_output_stream(storage.join(root, name)) as f:
                f.write(buffer.getvalue())

        storage.retrying(f"staging timeline entry {entry.time}", put)
        stats = FileStats(SCHEMA)
        for batch in data.to_batches():
            stats.add(batch)
        return StagedBatch(Description(entry.time, entry.time + 1), self.path,
                           [StagedFile(name, len(buffer.getvalue()), data.num_rows, stats.to_json())])


def _locations(sources: dict[str, str]) -> dict[str, str]:
    """Sources by name -> where each is (:func:`mvsink.view.location`): a copy of a pipeline
    whose relative paths are spelled from another folder declares the same sources."""
    return {name: location(path) for name, path in sources.items()}


def _entry_to_json(entry: Entry) -> str:
    return json.dumps({"time": entry.time, "versions": entry.versions, "minted_at": entry.minted_at},
                      sort_keys=True)


def _entry_from_json(raw) -> Entry:
    data = json.loads(raw) if isinstance(raw, str) else raw
    return Entry(int(data["time"]), {k: int(v) for k, v in data["versions"].items()}, int(data["minted_at"]))


def _span(times: list[int]) -> str:
    return f"{times[0]}..{times[-1]} ({len(times)} times)" if times else "none"
