"""S3 answering errors, throttling or slowly (injected in the test server): retried with bounded
backoff; a commit that landed but whose reply was lost is recognised and never made twice; when
the retries run out the append fails clearly and nothing committed is lost."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from helpers import S3_BUCKET, list_files, row_schema, s3_server_fixture, stage_row
from mvsink import storage
from mvsink.append import AppendError, Shard, compare_and_append
from mvsink.target.commit_info import META_COMMIT
from mvsink.mint import Description


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from s3_server_fixture(tmp_path_factory)


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setenv("MVSINK_S3_MAX_BACKOFF", "1")


@pytest.fixture
def table(s3, request):
    target = f"s3://{S3_BUCKET}/{request.node.name.replace('_', '-')[:60]}"
    DeltaTable.create(target, schema=row_schema(), storage_options=storage.storage_options(target))
    s3.faults([])
    yield target
    s3.faults([])


def _log(version: int) -> str:
    return rf"_delta_log/{version:020d}\.json"


def _commit_round(shard: Shard, target: str, lower: int, proc: int = 0) -> None:
    batch = stage_row(target, f"mvsink-faults-{lower}-{lower + 1}-p{proc}.parquet", proc, lower)
    assert compare_and_append(shard, batch.desc, batch, "correction").appended


def _state(target: str):
    """(upper, the view's commits as (lower, upper, commit id), rows as (round, proc), files)."""
    t = DeltaTable(target, storage_options=storage.storage_options(target))
    commits = [(h["mvsink.lower"], h["mvsink.upper"], h[META_COMMIT]) for h in reversed(t.history())
               if h.get("mvsink.view") == "faults"]
    rows = sorted((r["round"], r["proc"]) for r in t.to_pyarrow_table().to_pylist())
    files = {u.rsplit("/", 1)[1] for u in t.file_uris()}
    return t.transaction_version("mvsink:faults") or 0, commits, rows, files


def _fired(s3) -> list[int]:
    return [r["fired"] for r in s3.faults()]


def test_errors_throttling_and_slowness_on_stage_read_and_commit_are_retried(s3, table, fast_backoff):
    shard = Shard(table, "mvsink:faults", "faults", "p0")
    # Each fault outlasts the client's own retries (object_store: 4 tries, pyarrow: 3), so only
    # mvsink's retry (tenacity) gets the operation through.
    rules = [
        {"path": "mvsink-faults-0-1-p0", "fault": "500", "times": 4},                         # staging
        {"method": "GET", "path": "_delta_log/", "fault": "throttle", "times": 5},            # reading
        {"method": "PUT", "path": _log(1), "header": "If-None-Match", "fault": "503", "times": 5},  # commit
        {"method": "GET", "path": "list-type=2", "fault": "slow", "delay": 3, "times": 2},    # listing
    ]
    s3.faults(rules)
    batch = stage_row(table, "mvsink-faults-0-1-p0.parquet", 0, 0)
    result = compare_and_append(shard, Description(0, 1), batch, "correction")
    assert result.appended
    assert list_files(table, "mvsink-")  # the listing (slow) still answers
    assert _fired(s3) == [r["times"] for r in rules], "every injected fault happened"
    upper, commits, rows, files = _state(table)
    assert upper == 1 and [c[:2] for c in commits] == [(0, 1)]
    assert rows == [(0, 0)]
    assert files == {"mvsink-faults-0-1-p0.parquet"} <= list_files(table)


def test_a_commit_whose_reply_was_lost_is_recognised_and_not_made_twice(s3, table, fast_backoff):
    shard = Shard(table, "mvsink:faults", "faults", "p0")
    _commit_round(shard, table, 0)
    # The commit of [1, 2) lands (version 2) but the client gets a 500; its retry of the
    # conditional PUT then finds the entry there, as if another writer had won.
    s3.faults([{"method": "PUT", "path": _log(2), "header": "If-None-Match", "fault": "lost-reply"}])
    batch = stage_row(table, "mvsink-faults-1-2-p0.parquet", 0, 1)
    result = compare_and_append(shard, Description(1, 2), batch, "correction")
    assert _fired(s3) == [1], "the reply was lost"
    assert result.appended and result.upper == 2, "the landed commit is recognised as this append's"
    upper, commits, rows, files = _state(table)
    assert upper == 2
    assert [c[:2] for c in commits] == [(0, 1), (1, 2)], "committed once, not twice"
    assert rows == [(0, 0), (1, 0)]
    assert "mvsink-faults-1-2-p0.parquet" in files
    assert files <= list_files(table), "the files of the landed commit were kept"
    # A competing replica reading the same lower loses cleanly afterwards.
    other = Shard(table, "mvsink:faults", "faults", "p1")
    late = stage_row(table, "mvsink-faults-1-2-p1.parquet", 1, 1)
    assert not compare_and_append(other, Description(1, 2), late, "correction").appended
    assert "mvsink-faults-1-2-p1.parquet" not in list_files(table)


def test_when_retries_run_out_the_append_fails_clearly_and_nothing_committed_is_lost(s3, table, monkeypatch):
    monkeypatch.setenv("MVSINK_S3_ATTEMPTS", "3")
    monkeypatch.setenv("MVSINK_S3_MAX_BACKOFF", "0.5")
    shard = Shard(table, "mvsink:faults", "faults", "p0")
    _commit_round(shard, table, 0)
    _commit_round(shard, table, 1)
    before = _state(table)
    s3.faults([{"method": "PUT", "path": "_delta_log/", "fault": "503", "times": 10_000}])
    batch = stage_row(table, "mvsink-faults-2-3-p0.parquet", 0, 2)
    with pytest.raises(AppendError, match=r"append of \[2, 3\).*object store kept failing"):
        compare_and_append(shard, Description(2, 3), batch, "correction")
    assert _fired(s3)[0] > 3
    s3.faults([])
    assert _state(table) == before, "nothing committed was lost or changed"
    assert "mvsink-faults-2-3-p0.parquet" in list_files(table), "the staged file is kept, not deleted"
    # S3 is back: the same batch commits.
    assert compare_and_append(shard, Description(2, 3), batch, "correction").appended
    upper, commits, rows, _ = _state(table)
    assert upper == 3 and [c[:2] for c in commits] == [(0, 1), (1, 2), (2, 3)]
    assert rows == [(0, 0), (1, 0), (2, 0)]


def test_a_lost_reply_then_an_outage_fails_clearly_and_keeps_the_landed_commit(s3, table, monkeypatch):
    monkeypatch.setenv("MVSINK_S3_ATTEMPTS", "3")
    monkeypatch.setenv("MVSINK_S3_MAX_BACKOFF", "0.5")
    shard = Shard(table, "mvsink:faults", "faults", "p0")
    _commit_round(shard, table, 0)
    s3.faults([
        {"method": "PUT", "path": _log(2), "header": "If-None-Match", "fault": "lost-reply"},
        {"path": "", "fault": "503", "times": 10_000, "after_rule": 0},  # then S3 is down
    ])
    batch = stage_row(table, "mvsink-faults-1-2-p0.parquet", 0, 1)
    with pytest.raises(AppendError, match="object store kept failing"):
        compare_and_append(shard, Description(1, 2), batch, "correction")
    fired = _fired(s3)
    assert fired[0] == 1 and fired[1] > 0
    s3.faults([])
    upper, commits, rows, files = _state(table)
    assert upper == 2 and [c[:2] for c in commits] == [(0, 1), (1, 2)], "landed once"
    assert rows == [(0, 0), (1, 0)]
    assert files <= list_files(table), "nothing the landed commit references was deleted"


STAGE = """
import json, sys
from mvsink.mint import Description
from mvsink.spark import spark_session
from mvsink.write import stage
spark = spark_session("stage-faults")
rows = spark.createDataFrame([(i, None, 0, 1) for i in range(20)],
                             "id BIGINT, _mv_error STRING, _mv_time BIGINT, _mv_diff BIGINT").repartition(2)
batch = stage(rows, Description(0, 1), sys.argv[1], "faulty", "r0")
print("FILES " + json.dumps([[f.path, f.size, f.num_records] for f in batch.files]))
"""


def test_spark_tasks_staging_on_s3_retry_failed_uploads(s3, tmp_path):
    import json
    import os
    import subprocess
    import sys

    import pyarrow.parquet as pq

    target = f"s3://{S3_BUCKET}/staging-faults"
    # Uploads of the staged files fail more often than pyarrow's own retries absorb.
    rules = [{"path": "mvsink-faulty-0-1-r0", "fault": "503", "times": 4},
             {"path": "mvsink-faulty-0-1-r0", "fault": "throttle", "times": 4}]
    s3.faults(rules)
    env = {**os.environ, "MVSINK_S3": "0", "MVSINK_S3_MAX_BACKOFF": "1"}  # no S3A needed: no Spark read
    out = subprocess.run([sys.executable, "-c", STAGE, target], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    files = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("FILES "))[6:])
    assert _fired(s3) == [4, 4], "the uploads failed as injected"
    s3.faults([])
    assert sum(n for _, _, n in files) == 20 and len(files) == 2
    fs, root = storage.filesystem(target)
    for name, size, records in files:
        assert fs.get_file_info(f"{root}/{name}").size == size
        assert pq.read_table(f"{root}/{name}", filesystem=fs).num_rows == records
