"""Shrinking a failing case to a small reproduction, and printing it.

A smaller case still reproduces a failure if its one view fails the same way (same kind, and
for a crash the same error type), whatever the time. The other views, late replicas, and the
sources the view does not read (their rows and commits) are dropped first; then tried in turn,
each kept while it still fails: the times after the failing one, each time,
each commit, then the sources' first rows in halves, quarters, ... (delta debugging), all within
a budget of seconds.
"""

from __future__ import annotations

import time as clock
from dataclasses import replace

from .runner import Case, Failure, Runner, sources_read
from .tables import SCHEMAS, schema_sql, values_sql


def shrink(runner: Runner, case: Case, failure: Failure, budget_seconds: float = 300) -> tuple[Case, Failure, int]:
    """The smallest case found within ``budget_seconds`` that still fails as ``failure``, its
    failure, and how many runs it took."""
    deadline = clock.monotonic() + budget_seconds
    runs = 0

    def fails(candidate: Case) -> Failure | None:
        nonlocal runs
        runs += 1
        for found in runner.run(candidate).failures:
            if found.signature == failure.signature and found.replica == failure.replica:
                return found
        return None

    read = sources_read(failure.sql)  # the other sources' rows and commits cannot matter: dropped unrun
    tables = {t: spec if t in read else replace(spec, rows=[]) for t, spec in case.tables.items()}
    times = [[c for c in commits if c.table in read] for commits in case.times]
    best = Case(case.seed, tables, [case.views[failure.view]], [commits for commits in times if commits],
                {0} if failure.replica == "late" else set())
    found = Failure(0, failure.sql, failure.family, failure.kind, failure.time, failure.detail, failure.replica)

    def attempt(candidate: Case) -> bool:
        nonlocal best, found
        if clock.monotonic() > deadline:
            return False
        got = fails(candidate)
        if got is not None:
            best, found = candidate, got
        return got is not None

    if failure.replica == "r1" and failure.time is not None:  # the times after it (of those left)
        attempt(replace(best, times=[c for c in times[:failure.time] if c]))
    for at in reversed(range(len(best.times))):
        attempt(replace(best, times=best.times[:at] + best.times[at + 1:]))
    for at in range(len(best.times)):
        for n in reversed(range(len(best.times[at]))):
            if at < len(best.times) and n < len(best.times[at]) and len(best.times[at]) > 1:
                kept = best.times[at][:n] + best.times[at][n + 1:]
                attempt(replace(best, times=best.times[:at] + [kept] + best.times[at + 1:]))
    for table in SCHEMAS:
        chunk = len(best.tables[table].rows) // 2
        while chunk >= 1 and clock.monotonic() < deadline:
            start = 0
            while start < len(best.tables[table].rows):
                rows = best.tables[table].rows
                spec = replace(best.tables[table], rows=rows[:start] + rows[start + chunk:])
                if not attempt(replace(best, tables={**best.tables, table: spec})):
                    start += chunk
            chunk //= 2
    return best, found, runs


def reproduction(case: Case, failure: Failure) -> str:
    """``case`` and ``failure`` as text: the seed, the view's SQL, the sources' statements, the
    commits of each time (``{name}`` being the Delta table ``name``), and what went wrong."""
    sql, family = case.views[failure.view]
    lines = [f"seed {case.seed}, view {failure.view} ({family}{', its late replica' if failure.replica == 'late' else ''}):",
             f"  {sql}", f"{failure.kind} at time {failure.time}: {failure.detail}", "sources:"]
    for table, spec in case.tables.items():
        if table not in sources_read(sql):
            continue
        lines.append(f"  CREATE TABLE {table} ({schema_sql(table)}) USING delta TBLPROPERTIES "
                     f"(delta.enableChangeDataFeed = {str(spec.change_feed).lower()}, "
                     f"delta.enableDeletionVectors = {str(spec.deletion_vectors).lower()});")
        if spec.rows:
            lines.append(f"  INSERT INTO {table} VALUES {values_sql(spec.rows)};")
    lines.append("hydrated, then each time's commits and a step:")
    for at, commits in enumerate(case.times, 1):
        lines.append(f"  time {at}:")
        lines.extend(f"    {change};" for change in commits)
    return "\n".join(lines)
