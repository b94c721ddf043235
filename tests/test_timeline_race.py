"""Separate processes extending one timeline at once: one entry per time, no gap, no duplicate,
and no time that two processes read differently."""

from __future__ import annotations

import json
import multiprocessing
from collections import Counter

from deltalake import DeltaTable

from mvsink.timeline import APP_ID

PROCESSES = 4
ROUNDS = 120
SOURCES = {"a": "/nowhere/a", "b": "/nowhere/b"}


def _extend(path: str, proc: int, barrier, out_path: str, rounds: int) -> None:
    """Each round: propose the next time with versions of this process's own (a = the time, b =
    10 * time + proc, so proposals differ and never go back); record who won. A second barrier ends
    the round, so every process sees the same upper when deciding to stop."""
    from mvsink.timeline import Timeline

    timeline = Timeline(path, SOURCES, replica_id=f"p{proc}")
    attempts = []
    while True:
        barrier.wait(timeout=120)
        time_ = timeline.refresh()
        if time_ < rounds:
            won = timeline.extend({"a": time_, "b": 10 * time_ + proc}, "race", at=time_)
            attempts.append({"time": time_, "won": won})
        barrier.wait(timeout=120)
        if timeline.refresh() >= rounds:
            break
    seen = {e.time: e.versions for e in timeline.entries}
    with open(out_path, "w") as f:
        json.dump({"attempts": attempts, "seen": seen}, f)


def test_processes_extending_one_timeline_agree_on_every_time(tmp_path):
    path = str(tmp_path / "timeline")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    outs = [str(tmp_path / f"p{i}.json") for i in range(PROCESSES)]
    procs = [ctx.Process(target=_extend, args=(path, i, barrier, outs[i], ROUNDS)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=900)
        assert p.exitcode == 0, f"a process exited with {p.exitcode}"
    results = [json.load(open(o)) for o in outs]

    wins = Counter()
    tried = Counter()
    for proc, result in enumerate(results):
        for attempt in result["attempts"]:
            tried[attempt["time"]] += 1
            if attempt["won"]:
                wins[attempt["time"]] += 1
    assert sorted(wins) == list(range(ROUNDS)) and set(wins.values()) == {1}, "exactly one winner per time"
    contested = sum(1 for n in tried.values() if n > 1)
    assert contested >= ROUNDS // 2, f"only {contested} times were contested: the test did not race"

    table = DeltaTable(path)
    assert table.transaction_version(APP_ID) == ROUNDS
    rows = table.to_pyarrow_table().to_pylist()
    entries: dict[int, dict[str, int]] = {}
    for row in rows:
        assert row["source"] not in entries.setdefault(row["time"], {}), f"time {row['time']} twice"
        entries[row["time"]][row["source"]] = row["version"]
    assert sorted(entries) == list(range(ROUNDS)), "no gap, no duplicate"
    assert all(set(v) == set(SOURCES) and v["a"] == t for t, v in entries.items())
    for proc, result in enumerate(results):
        seen = {int(t): v for t, v in result["seen"].items()}
        assert seen == entries, f"process {proc} reads some time differently from the table"
    winners = Counter(v["b"] % 10 for v in entries.values())
    print(f"{PROCESSES} processes, {ROUNDS} times, {contested} contested, {sum(tried.values())} attempts, "
          f"wins per process {dict(winners)}")
