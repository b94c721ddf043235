"""Compare-and-append under real contention: separate processes committing to one local table, each
commit rewriting the table's files as the table layout does (one winner a round, no lost row)."""

from __future__ import annotations

import os
from collections import Counter

from deltalake import DeltaTable

from helpers import assert_race_log, race_outcome, row_schema, run_racers

PROCESSES = 4
ROUNDS = 120


def test_processes_racing_on_one_table_have_exactly_one_winner_per_round(tmp_path):
    target = str(tmp_path / "race")
    DeltaTable.create(target, schema=row_schema())
    outs = run_racers(target, PROCESSES, ROUNDS, tmp_path, timeout=900)

    winners, contested, attempts = race_outcome(outs, ROUNDS)
    print(f"{PROCESSES} processes, {ROUNDS} rounds, {contested} contested, {attempts} commit attempts, "
          f"wins per process {dict(Counter(p for p, _ in winners.values()))}")
    assert_race_log(DeltaTable(target), winners, ROUNDS)
    table = DeltaTable(target)
    winning_files = {f for _, f in winners.values()}
    assert table.file_uris() == [os.path.join(target, winners[ROUNDS - 1][1])], "the last winner's rewrite"
    on_disk = {f for f in os.listdir(target) if f.endswith(".parquet")}
    assert on_disk == winning_files, f"leftover loser files: {sorted(on_disk - winning_files)[:5]}"
