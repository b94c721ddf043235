"""Compare-and-append under real contention on S3: separate processes committing to one table
through a real HTTP S3 server (moto), with conditional PUTs for the log entries."""

from __future__ import annotations

from collections import Counter

import pytest
from deltalake import DeltaTable

from helpers import (S3_BUCKET, assert_race_log, list_files, race_outcome, row_schema, run_racers,
                     s3_server_fixture)
from mvsink import storage
from mvsink.target.commit_info import META_COMMIT

PROCESSES = 3
ROUNDS = 60
SCHEMA = row_schema()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from s3_server_fixture(tmp_path_factory)


def test_processes_racing_on_one_s3_table_have_exactly_one_winner_per_round(s3, tmp_path):
    target = f"s3://{S3_BUCKET}/race"
    # A checkpoint every 10 commits keeps each load of the table to a few requests (delta-rs's
    # default is 100: every racer would read the whole log each round).
    DeltaTable.create(target, schema=SCHEMA, storage_options=storage.storage_options(target),
                      configuration={"delta.checkpointInterval": "10"})
    outs = run_racers(target, PROCESSES, ROUNDS, tmp_path, timeout=1200)

    winners, contested, attempts = race_outcome(outs, ROUNDS)
    print(f"S3: {PROCESSES} processes, {ROUNDS} rounds, {contested} contested, {attempts} commit attempts, "
          f"wins per process {dict(Counter(p for p, _ in winners.values()))}")
    table = DeltaTable(target, storage_options=storage.storage_options(target))
    commits = assert_race_log(table, winners, ROUNDS)
    assert len({h[META_COMMIT] for h in commits}) == ROUNDS, "every commit carries its own attempt id"
    winning_files = {f for _, f in winners.values()}
    assert [u.rsplit("/", 1)[1] for u in table.file_uris()] == [winners[ROUNDS - 1][1]], "the last rewrite"
    on_s3 = {f for f in list_files(target) if f.endswith(".parquet")}
    assert on_s3 == winning_files, f"leftover loser files: {sorted(on_s3 - winning_files)[:5]}"
