"""Compare-and-append under real contention: separate processes committing to one local table."""

from __future__ import annotations

import json
import os
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from helpers import assert_race_log, race_outcome, run_racers

from mvsink.append import Shard, compare_and_append
from mvsink.mint import Description
from mvsink.write import StagedBatch, StagedFile
from mvsink.write.stats import FileStats

PROCESSES = 4
ROUNDS = 200
SCHEMA = pa.schema([("proc", pa.int64()), ("round", pa.int64()), ("_mv_error", pa.string()),
                    ("_mv_time", pa.int64()), ("_mv_diff", pa.int64())])


def _stage(target: str, proc: int, lower: int) -> StagedBatch:
    name = f"mvsink-race-{lower}-{lower + 1}-p{proc}-{os.getpid()}.parquet"
    batch = pa.RecordBatch.from_pylist(
        [{"proc": proc, "round": lower, "_mv_error": None, "_mv_time": lower, "_mv_diff": 1}], schema=SCHEMA)
    pq.write_table(pa.Table.from_batches([batch]), os.path.join(target, name))
    stats = FileStats(SCHEMA)
    stats.add(batch)
    size = os.path.getsize(os.path.join(target, name))
    return StagedBatch(Description(lower, lower + 1), target, [StagedFile(name, size, 1, stats.to_json())])


def _racer(target: str, proc: int, barrier, done, out_path: str) -> None:
    shard = Shard(target, "mvsink:race", "race", f"p{proc}")
    attempts = []
    while True:
        barrier.wait()
        if done.value:
            break
        upper = shard.upper()
        if upper >= ROUNDS:
            done.value = 1
            continue
        batch = _stage(target, proc, upper)
        result = compare_and_append(shard, batch.desc, batch, "correction")
        attempts.append({"lower": upper, "won": result.appended, "file": batch.files[0].path})
    with open(out_path, "w") as f:
        json.dump(attempts, f)


def test_processes_racing_on_one_table_have_exactly_one_winner_per_round(tmp_path):
    target = str(tmp_path / "race")
    DeltaTable.create(target, schema=SCHEMA)
    outs = run_racers(_racer, target, PROCESSES, tmp_path, timeout=900)

    winners, contested, attempts = race_outcome(outs, ROUNDS)
    print(f"{PROCESSES} processes, {ROUNDS} rounds, {contested} contested, {attempts} commit attempts, "
          f"wins per process {dict(Counter(p for p, _ in winners.values()))}")
    assert_race_log(DeltaTable(target), winners, ROUNDS)
    table = DeltaTable(target)
    winning_files = {f for _, f in winners.values()}
    assert set(table.file_uris()) == {os.path.join(target, f) for f in winning_files}
    on_disk = {f for f in os.listdir(target) if f.endswith(".parquet")}
    assert on_disk == winning_files, f"leftover loser files: {sorted(on_disk - winning_files)[:5]}"
