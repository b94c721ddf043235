"""Two replicas (separate processes, Spark reading through S3A) writing one view on S3; one is
killed with SIGKILL and restarted. The table equals the view at every committed version."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from helpers import S3_BUCKET, Replica, run_with_a_kill, s3_server_fixture, s3_table, write_config
from mvsink import storage
from mvsink.check import check_table, expected_from_source

SOURCE_VERSIONS = 14


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from s3_server_fixture(tmp_path_factory)


def test_two_replicas_on_s3_one_killed_and_restarted(s3, tmp_path):
    rng = random.Random(4)
    # The source as s3://, the target as s3a://: both spellings work everywhere.
    src, tgt = f"s3://{S3_BUCKET}/orders", f"s3a://{S3_BUCKET}/orders_view"
    write_deltalake(src, pa.table({"id": pa.array(range(10), pa.int64()), "v": [f"r0-{i}" for i in range(10)]}),
                    configuration={"delta.enableChangeDataFeed": "true"},
                    storage_options=storage.storage_options(src))
    config = write_config(tmp_path / "view.yaml", view_id="s3view", target=tgt, key=["id"],
                          input={"kind": "changes", "source": src})
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = [Replica(config, f"r{i}", logs).start() for i in range(2)]
    run = run_with_a_kill(fleet, src, tgt, "s3view", rng, SOURCE_VERSIONS)

    result = check_table(tgt, "s3view", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=tgt + "_timeline"))
    print(f"S3: 2 replicas, {run.victim.replica_id} killed with SIGKILL at source version {run.kill_at} (upper "
          f"{run.upper_at_kill}) and restarted; source versions {run.latest}: {result.summary()}")
    assert result.ok, result.problems[:5]
    assert run.victim.starts == 2
    assert result.versions_checked >= SOURCE_VERSIONS // 2, "the view was written step by step"
    assert run.upper_at_kill is not None and run.upper_at_kill < run.final_upper, "the kill came before the end"
    # Every file a commit references is on S3 (cleanup never took one).
    fs, root = storage.filesystem(tgt)
    for uri in s3_table(tgt).file_uris():
        assert fs.get_file_info(uri.split("://", 1)[1]).size is not None, uri
