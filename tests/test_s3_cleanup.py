"""Staged files on S3 that lost a race or were left by a crash are deleted; files a commit
references never are."""

from __future__ import annotations

import time

import pytest
from deltalake import DeltaTable

from helpers import S3_BUCKET, list_files, row_schema, s3_server_fixture, stage_row
from mvsink import storage
from mvsink.append import Shard, compare_and_append
from mvsink.cleanup import clean_orphans


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from s3_server_fixture(tmp_path_factory)


def test_losers_and_crash_leftovers_are_cleaned_up_on_s3_never_committed_files(s3):
    target = f"s3://{S3_BUCKET}/cleanup"
    DeltaTable.create(target, schema=row_schema(), storage_options=storage.storage_options(target))
    winner, loser = Shard(target, "mvsink:tidy", "tidy", "r0"), Shard(target, "mvsink:tidy", "tidy", "r1")

    # A race: both stage for [0, 1); the loser deletes its file at once.
    won = stage_row(target, "mvsink-tidy-0-1-r0-aaaa-00000-0.parquet", 0, 0)
    lost = stage_row(target, "mvsink-tidy-0-1-r1-bbbb-00000-0.parquet", 1, 0)
    assert compare_and_append(winner, won.desc, won, "correction").appended
    assert not compare_and_append(loser, lost.desc, lost, "correction").appended
    assert "mvsink-tidy-0-1-r1-bbbb-00000-0.parquet" not in list_files(target)

    # A crash between staging and committing leaves a file no commit references; another view's
    # staged file and a committed file sit next to it.
    stage_row(target, "mvsink-tidy-1-2-r1-cccc-00000-0.parquet", 1, 1)
    stage_row(target, "mvsink-other-1-2-r1-dddd-00000-0.parquet", 1, 1)
    second = stage_row(target, "mvsink-tidy-1-2-r0-eeee-00000-0.parquet", 0, 1)
    assert compare_and_append(winner, second.desc, second, "correction").appended
    committed = {"mvsink-tidy-0-1-r0-aaaa-00000-0.parquet", "mvsink-tidy-1-2-r0-eeee-00000-0.parquet"}

    # Young files are spared (another replica may be about to commit them).
    assert clean_orphans(winner, grace_seconds=3600) == 0
    assert "mvsink-tidy-1-2-r1-cccc-00000-0.parquet" in list_files(target)

    time.sleep(1.5)  # S3 mtimes have second resolution: let every file be older than a 1 s grace
    assert clean_orphans(winner, grace_seconds=1) == 1
    remaining = list_files(target, "mvsink-")
    assert remaining == committed | {"mvsink-other-1-2-r1-dddd-00000-0.parquet"}
    table = DeltaTable(target, storage_options=storage.storage_options(target))
    assert {u.rsplit("/", 1)[1] for u in table.file_uris()} == committed
    assert sorted((r["round"], r["proc"]) for r in table.to_pyarrow_table().to_pylist()) == [(0, 0), (1, 0)]
    assert clean_orphans(winner, grace_seconds=1) == 0, "nothing left to clean"


def test_cleanup_survives_s3_failing(s3, monkeypatch):
    monkeypatch.setenv("MVSINK_S3_ATTEMPTS", "2")
    monkeypatch.setenv("MVSINK_S3_MAX_BACKOFF", "0.2")
    target = f"s3://{S3_BUCKET}/cleanup-faults"
    DeltaTable.create(target, schema=row_schema(), storage_options=storage.storage_options(target))
    shard = Shard(target, "mvsink:tidy", "tidy", "r0")
    stage_row(target, "mvsink-tidy-0-1-r1-ffff-00000-0.parquet", 1, 0)
    time.sleep(1.5)
    s3.faults([{"method": "GET", "fault": "503", "times": 10_000}])
    try:
        assert clean_orphans(shard, grace_seconds=1) == 0, "an outage skips cleanup, it does not fail"
    finally:
        s3.faults([])
    assert "mvsink-tidy-0-1-r1-ffff-00000-0.parquet" in list_files(target)
    assert clean_orphans(shard, grace_seconds=1) == 1
    assert "mvsink-tidy-0-1-r1-ffff-00000-0.parquet" not in list_files(target)
