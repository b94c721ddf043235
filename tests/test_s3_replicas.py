"""Two replicas (separate processes, Spark reading through S3A) writing one view on S3; one is
killed with SIGKILL and restarted. The table equals the view at every committed version."""

from __future__ import annotations

import random
import signal
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from helpers import S3_BUCKET, Replica, s3_server_fixture, view_upper_of, wait_for, write_config
from mvsink import storage
from mvsink.check import caught_up, check_table, expected_from_source

SOURCE_VERSIONS = 14


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from s3_server_fixture(tmp_path_factory)


def _table(uri: str) -> DeltaTable:
    return DeltaTable(storage.delta_uri(uri), storage_options=storage.storage_options(uri))


def _upper(uri: str, app_id: str) -> int | None:
    try:
        return _table(uri).transaction_version(app_id)
    except Exception:  # not created yet
        return None


def _edit(src: str, rng: random.Random, version: int, next_id: list[int]) -> None:
    """One source commit (delta-rs, change data feed on): insert, update or delete."""
    opts = storage.storage_options(src)
    op = rng.choice(["insert", "insert", "update", "delete"])
    if op == "insert":
        ids = list(range(next_id[0], next_id[0] + rng.randint(1, 4)))
        next_id[0] += len(ids)
        write_deltalake(src, pa.table({"id": pa.array(ids, pa.int64()), "v": [f"r{version}-{i}" for i in ids]}),
                        mode="append", storage_options=opts)
    elif op == "update":
        _table(src).update(predicate=f"id % 3 = {version % 3}", updates={"v": f"concat(v, '+{version}')"})
    else:
        _table(src).delete(f"id % 7 = {version % 7}")


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
    try:
        wait_for(lambda: _upper(tgt, "mvsink:s3view"), timeout=300, what="the first commit", watch=tuple(fleet))
        next_id = [100]
        kill_at = rng.randrange(3, SOURCE_VERSIONS - 4)
        victim = upper_at_kill = None
        for version in range(SOURCE_VERSIONS):
            _edit(src, rng, version, next_id)
            if version == kill_at:
                # Kill the replica that made the latest commit, in whatever it is doing.
                last = next(h for h in _table(tgt).history() if h.get("mvsink.view") == "s3view")
                victim = next(r for r in fleet if r.replica_id == last["mvsink.replica"])
                victim.kill(signal.SIGKILL)
                upper_at_kill = _upper(tgt, "mvsink:s3view")
                victim.start()
            elif version % 2 == 0:
                # Let the view catch up now and then, so that the table has many versions.
                wait_for(lambda: caught_up(tgt, "s3view"), timeout=400,
                         what=f"the view to reach source version {_table(src).version()}", watch=tuple(fleet))
            time.sleep(rng.uniform(0.2, 1.5))
        for replica in fleet:
            assert replica.alive(), replica.logs()[-3000:]
        latest = _table(src).version()
        wait_for(lambda: caught_up(tgt, "s3view"), timeout=400,
                 what=f"the view to reach source version {latest}", watch=tuple(fleet))
        final_upper = view_upper_of(tgt, "s3view")
    finally:
        for replica in fleet:
            replica.kill(signal.SIGTERM)

    result = check_table(tgt, "s3view", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=tgt + "_timeline"))
    print(f"S3: 2 replicas, {victim.replica_id} killed with SIGKILL at source version {kill_at} (upper "
          f"{upper_at_kill}) and restarted; source versions {latest}: {result.summary()}")
    assert result.ok, result.problems[:5]
    assert victim.starts == 2
    assert result.versions_checked >= SOURCE_VERSIONS // 2, "the view was written step by step"
    assert upper_at_kill is not None and upper_at_kill < final_upper, "the kill came before the end"
    # Every file a commit references is on S3 (cleanup never took one).
    table = _table(tgt)
    fs, root = storage.filesystem(tgt)
    for uri in table.file_uris():
        assert fs.get_file_info(uri.split("://", 1)[1]).size is not None, uri
