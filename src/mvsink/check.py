"""An independent check that a target table holds its view, at every committed version.

It shares nothing with the sink: it reads the timeline, the sources' snapshots and the target's
versions with delta-rs and pyarrow, computes the desired rows itself, and consolidates updates
itself. A time stands for the source versions the timeline's entry gives it.

For every committed version of the target, for every time `t` in `[since, upper)` at that version
(since: ``as_of``, or later once compacted), the consolidated rows at `t` must equal ``expected(t)``; the mvsink commits must cover each time
range once (each commit's lower is the previous upper: no duplicates, no gaps).

A target in the table layout holds the view's rows: every version made by a commit of the view
for `[lower, upper)` must read (plain rows, as any Delta reader sees them) as ``expected(t)`` for
every `t` in `[lower, upper)`, with no error update in the error files it lists; versions made by
foreign commits, a commit that landed on a foreign commit it had not read, and a compaction of such a
commit are not the view's and are counted apart (:attr:`CheckResult.foreign_versions`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from deltalake import DeltaTable

from mvsink import storage
from mvsink.target.layout import TABLE, error_files, error_messages, layout_of
from mvsink.table import CONTENT_PRESERVING, commit_info, latest_version
from mvsink.timeline import APP_ID as TIMELINE_APP_ID
from mvsink.timeline import SOURCES_PROPERTY
from mvsink.updates import DIFF, ERROR, TIME

Row = tuple


def table_at(uri: str, version: int | None = None) -> DeltaTable:
    """The table at ``uri`` (local, ``s3://`` or ``s3a://``) at ``version``, retried on S3 hiccups."""
    return storage.retrying(f"loading {uri}", DeltaTable, storage.delta_uri(uri), version=version,
                            storage_options=storage.storage_options(uri))


def rows_of(table: DeltaTable, columns: list[str]):
    """``table``'s rows of ``columns`` as an Arrow table, without the rows deletion vectors delete:
    through delta-rs's ``QueryBuilder`` (DataFusion) where the table has them, as delta-rs's
    ``to_pyarrow_table`` refuses such a table."""
    if "deletionVectors" not in (table.protocol().reader_features or ()):
        return table.to_pyarrow_table(columns=columns)
    from deltalake import QueryBuilder

    listed = ", ".join(f'"{c}"' for c in columns)
    return QueryBuilder().register("t", table).execute(f"SELECT {listed} FROM t").read_all()


def source_rows(source: str, version: int, columns: list[str]) -> Counter:
    """The multiset of ``columns`` tuples in the source at ``version``."""
    table = rows_of(table_at(source, version), columns)
    return Counter(zip(*(table.column(c).to_pylist() for c in columns)))


class TimelineReader:
    """A timeline's entries, time -> {source name: version}, read with delta-rs (re-read when a
    time asked for is not there yet)."""

    def __init__(self, path: str):
        self.path = path
        self.entries: dict[int, dict[str, int]] = {}

    def versions(self, t: int) -> dict[str, int]:
        if t not in self.entries:
            self.entries = {}
            for row in table_at(self.path).to_pyarrow_table(columns=["time", "source", "version"]).to_pylist():
                self.entries.setdefault(row["time"], {})[row["source"]] = row["version"]
        return self.entries[t]

    def version(self, t: int, source: str | None = None) -> int:
        """The version time ``t`` stands for of ``source`` (default: the only one)."""
        versions = self.versions(t)
        if source is None:
            (source,) = versions
        return versions[source]


def caught_up(target: str, view_id: str, timeline: str | None = None) -> bool:
    """Whether the view has every time of its timeline, and the latest time stands for every
    source's newest version (timeline default: ``<target>_timeline``)."""
    timeline = timeline or target + "_timeline"
    if latest_version(timeline) is None or latest_version(target) is None:
        return False
    table = table_at(timeline)
    upper = table.transaction_version(TIMELINE_APP_ID) or 0
    if upper == 0 or (table_at(target).transaction_version(f"mvsink:{view_id}") or 0) != upper:
        return False
    sources = json.loads(table.metadata().configuration[SOURCES_PROPERTY])
    last = TimelineReader(timeline).versions(upper - 1)
    return all(last[name] == latest_version(path) for name, path in sources.items())


def expected_from_source(source: str, columns: list[str],
                         map_row: Callable[[dict], dict | None] | None = None, *,
                         timeline: str, name: str | None = None) -> Callable[[int], Counter]:
    """expected(t): the source at the version time t stands for on ``timeline`` (source ``name``,
    default its only one), through ``map_row``. Cached per version."""
    cache: dict[int, Counter] = {}
    reader = TimelineReader(timeline)

    def expected(t: int) -> Counter:
        v = reader.version(t, name)
        if v not in cache:
            rows = source_rows(source, v, columns if map_row is None else _all_columns(source, v))
            if map_row is not None:
                names = _all_columns(source, v)
                mapped = Counter()
                for row, n in rows.items():
                    out = map_row(dict(zip(names, row)))
                    if out is not None:
                        mapped[tuple(out[c] for c in columns)] += n
                rows = mapped
            cache[v] = rows
        return cache[v]

    return expected


def _all_columns(source: str, version: int) -> list[str]:
    return [f.name for f in table_at(source, version).schema().fields]


@dataclass
class CheckResult:
    versions_checked: int = 0
    times_checked: int = 0
    commits: list[tuple[int, int, str, str]] = field(default_factory=list)  # lower, upper, reason, replica
    problems: list[str] = field(default_factory=list)
    #: For each table version with problems, the times at which the table differs from the view.
    bad_times: dict[int, list[int]] = field(default_factory=dict)
    #: Table layout: versions not checked, made by or on a foreign commit.
    foreign_versions: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        replicas = Counter(c[3] for c in self.commits)
        return (f"{self.versions_checked} table versions, {self.times_checked} (version, time) views "
                f"checked, {len(self.commits)} mvsink commits by {dict(replicas)}: "
                + ("all correct" if self.ok else f"{len(self.problems)} problems, first: {self.problems[:3]}"))


def check_table(target: str, view_id: str, columns: list[str], expected: Callable[[int], Counter],
                as_of: int = 0, from_version: int = 0) -> CheckResult:
    """Check every committed version of ``target`` from ``from_version`` (see module doc)."""
    if layout_of(target) == TABLE:
        return _check_rows(target, view_id, columns, expected, as_of, from_version)
    result = CheckResult()
    latest = table_at(target).version()
    result.commits = _mvsink_commits(target, view_id)
    _check_contiguous(result)
    app_id = f"mvsink:{view_id}"
    compactions = _compactions(target, view_id)
    for version in range(from_version, latest + 1):
        table = table_at(target, version)
        upper = table.transaction_version(app_id) or 0
        if upper <= as_of:
            continue
        since = max([as_of] + [s for v, s in compactions if v <= version])
        result.versions_checked += 1
        data = rows_of(table, columns + [ERROR, TIME, DIFF])
        updates = sorted(
            zip(data.column(TIME).to_pylist(), data.column(DIFF).to_pylist(), data.column(ERROR).to_pylist(),
                zip(*(data.column(c).to_pylist() for c in columns))),
            key=lambda u: (u[0] if u[0] is not None else 0),
        )
        contents: Counter = Counter()
        errors: Counter = Counter()
        i = 0
        for t in range(as_of, upper):
            while i < len(updates) and (updates[i][0] if updates[i][0] is not None else 0) <= t:
                time, diff, error, row = updates[i]
                diff = 1 if diff is None else diff
                if error is None:
                    contents[row] += diff
                else:
                    errors[error] += diff
                i += 1
            if t < since:
                continue  # compacted away: not readable at this version
            result.times_checked += 1
            have = +contents
            want = expected(t)
            if have != want or +errors:
                result.bad_times.setdefault(version, []).append(t)
                missing, extra = want - have, have - want
                result.problems.append(
                    f"version {version} time {t}: missing {dict(list(missing.items())[:3])}, "
                    f"extra {dict(list(extra.items())[:3])}, errors {dict(list((+errors).items())[:2])}"
                )
    return result



def _check_rows(target: str, view_id: str, columns: list[str], expected: Callable[[int], Counter],
                as_of: int, from_version: int) -> CheckResult:
    """:func:`check_table` for a target in the table layout (see the module doc)."""
    result = CheckResult(commits=_mvsink_commits(target, view_id))
    _check_contiguous(result)
    foreign: list[int] = []
    not_the_view: set[int] = set()  # foreign versions, and the view's commits that hold a foreign change
    for version in range(0, table_at(target).version() + 1):
        info = commit_info(target, version)
        if info.get("mvsink.view") != view_id:
            if info.get("operation") not in CONTENT_PRESERVING:
                foreign.append(version)
                not_the_view.add(version)
                if version >= from_version:
                    result.foreign_versions.append(version)
            continue
        lower, upper = int(info["mvsink.lower"]), int(info["mvsink.upper"])
        readback = int(info.get("mvsink.readback", -1))
        tainted = (any(readback < f < version for f in foreign)
                   or info.get("mvsink.reason") == "compaction" and readback in not_the_view)
        if tainted:
            not_the_view.add(version)  # a compaction holds the rows of the version it rearranged
        skipped = info.get("mvsink.reason") == "advance-upper" or version < from_version or upper <= as_of
        if tainted and not skipped:
            result.foreign_versions.append(version)
        if tainted or skipped:
            continue
        times = range(max(lower, as_of), upper) if lower < upper else [upper - 1]
        table = table_at(target, version)
        data = rows_of(table, columns)
        have = Counter(zip(*(data.column(c).to_pylist() for c in columns)))
        errors = error_messages(target, error_files(info) or [])
        result.versions_checked += 1
        for t in times:
            result.times_checked += 1
            want = expected(t)
            if have != want or errors:
                result.bad_times.setdefault(version, []).append(t)
                missing, extra = want - have, have - want
                result.problems.append(
                    f"version {version} time {t}: missing {dict(list(missing.items())[:3])}, "
                    f"extra {dict(list(extra.items())[:3])}, errors {dict(list(errors.items())[:2])}")
    return result


def _check_contiguous(result: CheckResult) -> None:
    previous_upper = None
    for lower, upper, _reason, _replica in result.commits:
        if previous_upper is not None and lower != previous_upper:
            result.problems.append(f"commit [{lower}, {upper}) does not start at the previous upper {previous_upper}")
        previous_upper = upper


def _mvsink_commits(target: str, view_id: str) -> list[tuple[int, int, str, str]]:
    """(lower, upper, reason, replica) of the view's commits, oldest first."""
    commits = []
    for info in reversed(table_at(target).history()):
        if info.get("mvsink.view") == view_id:
            commits.append((int(info["mvsink.lower"]), int(info["mvsink.upper"]),
                            info.get("mvsink.reason"), info.get("mvsink.replica")))
    return commits


def _compactions(target: str, view_id: str) -> list[tuple[int, int]]:
    """(table version, since) of the view's compaction commits."""
    return [(info["version"], int(info["mvsink.since"])) for info in table_at(target).history()
            if info.get("mvsink.view") == view_id and info.get("mvsink.since") is not None]
