"""Runs a case: its sources made, each view hydrated and caught up time after time while the
sources change, and every time of every view compared with the full evaluation of its SQL by
Spark over the sources as of that time's versions (both read by delta-rs, :mod:`.reads`).

A case is a function of its seed (:func:`random_case`), so a seed reproduces it. Views share the
case's sources and are each hydrated once. A view that crashes or differs is recorded as a
:class:`Failure` and left behind; the others go on. Views of :attr:`Case.late` have a second view
of the same SQL (a target of its own), hydrated at the start and caught up only at the end: its
one step spans every commit of the run.
"""

from __future__ import annotations

import math
import random
import re
import time as clock
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .changes import Change, random_times
from .grammar import random_view
from .tables import SCHEMAS, TableSpec, create, random_tables


@dataclass
class Case:
    """Sources (first rows, properties), views (SQL, family), the commits of each time, and
    which views get a late replica."""

    seed: int
    tables: dict[str, TableSpec]
    views: list[tuple[str, str]]
    times: list[list[Change]]
    late: set[int] = field(default_factory=set)


def random_case(seed: int, families: tuple[str, ...] | None = None, views: int = 6, times: int = 4,
                late: int = 2) -> Case:
    """The case of ``seed``: a view of each of ``families`` (else ``views`` of random families),
    ``times`` times of commits, ``late`` of the views with a late replica."""
    rng = random.Random(seed)
    tables = random_tables(rng)
    chosen = [random_view(rng, family) for family in (families or [None] * views)]
    made = random_times(rng, tables, times)
    return Case(seed, tables, chosen, made, set(rng.sample(range(len(chosen)), min(late, len(chosen)))))


@dataclass
class Failure:
    """A view that differed from the full evaluation (``mismatch``), raised (``crash``), or whose
    strategy raised in a step that then evaluated the query in full (``strategy failed``: its rows
    exact, its strategy not) at ``time`` (None: at its start); ``replica`` ``late`` if its late
    replica did."""

    view: int
    sql: str
    family: str
    kind: str
    time: int | None
    detail: str
    replica: str = "r1"

    @property
    def signature(self) -> tuple[str, str]:
        """What a smaller case must still show to reproduce it: its kind and, for a crash, the error's type."""
        return self.kind, self.detail.split(":", 1)[0] if self.kind in ("crash", "strategy failed") else ""


@dataclass
class Outcome:
    """What a run found: failures, the strategies each view's steps took, times compared."""

    failures: list[Failure] = field(default_factory=list)
    strategies: dict[int, set[str]] = field(default_factory=dict)
    times_compared: int = 0
    #: Seconds in all, stepping the views, and evaluating and reading them to compare.
    seconds: float = 0.0
    step_seconds: float = 0.0
    compare_seconds: float = 0.0


def sources_read(sql: str) -> list[str]:
    return [t for t in SCHEMAS if re.search(rf"\b{t}\b", sql)]


def _normal(value):
    """Floats to 12 significant digits (an average of integers, a double): the rest is rounding."""
    if isinstance(value, float) and math.isfinite(value) and value != 0:
        return round(value, 11 - int(math.floor(math.log10(abs(value)))))
    return value


def _rows(frame) -> Counter:
    return Counter(tuple(_normal(v) for v in row) for row in frame.collect())


class Runner:
    """Runs cases in one SparkSession, under ``workdir`` (a fresh folder per run)."""

    def __init__(self, spark, workdir: Path):
        self.spark, self.workdir, self.runs = spark, Path(workdir), 0

    def run(self, case: Case, only: set[int] | None = None) -> Outcome:
        """Runs ``case`` (its views of ``only``, if given) and returns what it found."""
        from mvsink import ConfigError, MaterializedView, SnapshotInput, ViewDefinition

        started = clock.monotonic()
        self.runs += 1
        base = self.workdir / f"run{self.runs}"
        paths = {t: str(base / "sources" / t) for t in SCHEMAS}
        for table, spec in case.tables.items():
            create(self.spark, table, paths[table], spec)
        outcome = Outcome()

        def view(i: int, sql: str, replica: str):
            view_id = f"v{i}" if replica == "r1" else f"late{i}"
            sources = {t: paths[t] for t in sources_read(sql)}
            for refresh in ("incremental", "auto"):  # auto: evaluated in full, no strategy maintains it
                try:
                    return MaterializedView(self.spark, ViewDefinition(
                        view_id, str(base / view_id), SnapshotInput(sql=sql, refresh=refresh), sources=sources,
                        replica_id=replica))
                except ConfigError as exc:
                    if refresh == "auto" or "refresh incremental" not in str(exc):
                        raise

        live: dict[tuple[int, str], object] = {}
        compared: dict[tuple[int, str], int] = {}
        for i, (sql, family) in enumerate(case.views):
            if only is not None and i not in only:
                continue
            for replica in ("r1", "late") if i in case.late else ("r1",):
                try:
                    self._valid(sql, paths)
                    live[i, replica] = view(i, sql, replica)
                except Exception as exc:  # noqa: BLE001 - every failure is recorded, none stops the run
                    kind = "invalid sql" if getattr(exc, "invalid_sql", False) else "crash"
                    outcome.failures.append(Failure(i, sql, family, kind, None, _error(exc), replica))
                compared[i, replica] = 0
        for at in range(len(case.times) + 1):
            if at:
                for change in case.times[at - 1]:
                    self.spark.sql(change.on(paths[change.table]))
            for key, materialized in list(live.items()):
                if key[1] == "late" and 0 < at < len(case.times):
                    continue
                i, replica = key
                sql, family = case.views[i]
                try:
                    stepping = clock.monotonic()
                    taken, failed = _catch_up(materialized)
                    outcome.strategies.setdefault(i, set()).update(taken)
                    outcome.failures += [Failure(i, sql, family, "strategy failed", at, why, replica) for why in failed[:1]]
                    comparing = clock.monotonic()
                    compared[key], differ = self._compare(materialized, sql, paths, compared[key])
                    outcome.step_seconds += comparing - stepping
                    outcome.compare_seconds += clock.monotonic() - comparing
                except Exception as exc:  # noqa: BLE001
                    outcome.failures.append(Failure(i, sql, family, "crash", at, _error(exc), replica))
                    del live[key]
                    continue
                if differ:
                    outcome.failures.append(Failure(i, sql, family, "mismatch", at, differ, replica))
                    del live[key]
        outcome.times_compared = sum(compared.values())
        outcome.seconds = clock.monotonic() - started
        return outcome

    def _valid(self, sql: str, paths: dict[str, str]) -> None:
        """Raises, marked as invalid SQL, if Spark cannot evaluate ``sql`` over the sources (a
        defect of the grammar's, or of Spark's: not mvsink's)."""
        for table in sources_read(sql):
            self.spark.read.format("delta").load(paths[table]).createOrReplaceTempView(table)
        try:
            self.spark.sql(sql).collect()
        except Exception as exc:
            exc.invalid_sql = True
            raise

    def _compare(self, materialized, sql: str, paths: dict[str, str], since: int) -> tuple[int, str | None]:
        """The view's times from ``since`` to its upper each compared with ``sql`` evaluated by
        Spark over the sources at that time's versions; the new upper, and how the first that
        differs differs (None if none)."""
        from mvsink.check import TimelineReader

        from .reads import source_at, view_at

        view = materialized.view
        target = view.target
        reader = TimelineReader(target + "_timeline")
        upper = materialized.observed_upper
        for at in range(since, upper):
            versions = reader.versions(at)
            for name, version in versions.items():
                source_at(self.spark, paths[name], version).createOrReplaceTempView(name)
            expected = _rows(self.spark.sql(sql))
            got = _rows(view_at(self.spark, target, view.view_id, at))
            if got != expected:
                return upper, (f"time {at} (source versions {versions}): rows it has too many "
                               f"{_some(got - expected)}, too few {_some(expected - got)}")
        return upper, None


def _catch_up(materialized, max_steps: int = 50) -> tuple[set[str], list[str]]:
    """Steps until caught up; the strategies of its steps' changes (with why one was evaluated in
    full), and why each step whose strategy failed did (the step evaluated the query in full
    instead: exact, but a defect of the strategy's)."""
    taken, failed = set(), []
    for _ in range(max_steps):
        report = materialized.step()
        if report.strategy not in (None, "hydration"):
            taken.add(report.strategy + (f" ({report.fallback.kind})" if report.fallback else ""))
        if report.fallback is not None and report.fallback.kind == "failed":
            failed.append(report.fallback.why)
        last = materialized.timeline.last()
        if (report.desc is None and last is not None and report.upper >= materialized.timeline.upper
                and last.versions == materialized.desired.latest_versions()):
            return taken, failed
    raise RuntimeError(f"did not catch up in {max_steps} steps")


def _some(rows: Counter, most: int = 6) -> str:
    """``rows`` (with their counts), the first ``most`` of them and how many more."""
    items = sorted(rows.items(), key=repr)
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return "{" + ", ".join(f"{row}: {n}" for row, n in items[:most]) + "}" + more


def _error(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {' '.join(lines[:2])[:400]}"
