"""Log entries mvsink writes itself (:mod:`mvsink.append.log_entry`): of the processes racing for
a version exactly one creates it, a writer killed between its deletion vector's file and its
commit leaves the table as it was, and S3 refuses a second entry of one version; what lands is
read by delta-rs, DuckDB and Spark."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from helpers import duckdb_with_delta, rows_by_readers, s3_server_fixture, wait_for
from mvsink import storage
from mvsink.append import log_entry
from mvsink.write import deletion_vectors as dv

SRC = str(Path(__file__).resolve().parents[1] / "src")
WRITERS, VERSIONS = 3, 25
SCHEMA = pa.schema([("version", pa.int64()), ("writer", pa.int64())])


def _race(table: str, writer: int, writers: int, versions: int, out: str) -> None:
    """One racer of ``writers``: for every version in turn, a one-row file, then, once every racer
    has its own (a file ``<version>-<writer>`` each in ``ready/`` beside the table), an attempt to
    commit it as that version; which versions it won, to ``out``. So every version is contested:
    a racer that won the last one is not ahead of the others for the next."""
    ready = Path(table).parent / "ready"
    won = []
    for version in range(1, versions + 1):
        name = f"part-{writer}-{version}.parquet"
        pq.write_table(pa.table({"version": [version], "writer": [writer]}, schema=SCHEMA), os.path.join(table, name))
        (ready / f"{version}-{writer}").touch()
        while len(list(ready.glob(f"{version}-*"))) < writers:
            time.sleep(0.001)
        now = int(time.time() * 1000)
        stats = {"numRecords": 1, "minValues": {"version": version, "writer": writer},
                 "maxValues": {"version": version, "writer": writer}, "nullCount": {"version": 0, "writer": 0}}
        add = {"add": {"path": name, "size": os.path.getsize(os.path.join(table, name)), "partitionValues": {},
                       "modificationTime": now, "dataChange": True, "stats": json.dumps(stats)}}
        if log_entry.commit_entry(table, version, [log_entry.txn_action("race", version, now), add],
                                  {"operation": "WRITE", "mvsink.replica": writer}):
            won.append(version)
    with open(out, "w") as f:
        json.dump(won, f)


def _duckdb_rows(table: str, columns: str) -> Counter:
    return Counter(duckdb_with_delta().execute(f"SELECT {columns} FROM delta_scan('{table}')").fetchall())


def _delta_rs_rows(table: str, columns: str, storage_options: dict | None = None) -> Counter:
    """The rows delta-rs reads (``QueryBuilder``: it applies deletion vectors, ``to_pyarrow_table`` refuses them)."""
    rows = QueryBuilder().register("t", DeltaTable(table, storage_options=storage_options)).execute(
        f"SELECT {columns} FROM t").read_all()
    return Counter(zip(*(rows.column(i).to_pylist() for i in range(rows.num_columns))))


def test_processes_racing_for_every_version_each_create_it_only_if_they_win(tmp_path):
    table = str(tmp_path / "raced")
    write_deltalake(table, SCHEMA.empty_table())
    outs = [str(tmp_path / f"won-{w}.json") for w in range(WRITERS)]
    (tmp_path / "ready").mkdir()
    racers = [subprocess.Popen([sys.executable, __file__, "race", table, str(w), str(WRITERS), str(VERSIONS), outs[w]],
                               env={**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(Path(__file__).parent)])})
              for w in range(WRITERS)]
    for racer in racers:
        assert racer.wait(timeout=300) == 0
    won = {w: json.loads(Path(out).read_text()) for w, out in enumerate(outs)}
    winner = {version: w for w, versions in won.items() for version in versions}
    print(f"{WRITERS} racers, {VERSIONS} versions: won {', '.join(f'{len(v)} by {w}' for w, v in won.items())}")
    assert sum(len(v) for v in won.values()) == VERSIONS, f"a version won twice: {won}"
    assert sorted(winner) == list(range(1, VERSIONS + 1))
    assert len([w for w in won if won[w]]) >= 2, f"one racer won every version: {won}"
    for version, w in winner.items():
        entry = Path(log_entry.entry_uri(table, version)).read_text().splitlines()
        assert json.loads(entry[0])["commitInfo"]["mvsink.replica"] == w
    assert not [p.name for p in (Path(table) / "_delta_log").iterdir() if p.name.endswith(".tmp")]
    expected = Counter((version, w) for version, w in winner.items())
    assert DeltaTable(table).version() == VERSIONS
    assert DeltaTable(table).transaction_version("race") == VERSIONS
    assert _delta_rs_rows(table, "version, writer") == expected
    assert _duckdb_rows(table, "version, writer") == expected


def _dv_table(uri: str, storage_options: dict | None = None) -> dict:
    """A table allowing deletion vectors, ids 0-9 in one file; that file's add action."""
    write_deltalake(uri, pa.table({"id": pa.array(range(10), pa.int64())}),
                    configuration={"delta.enableDeletionVectors": "true"}, storage_options=storage_options)
    fs, path = storage.filesystem(log_entry.entry_uri(uri, 0))
    with fs.open_input_stream(path) as f:
        entry = [json.loads(line) for line in f.read().decode().splitlines()]
    return next(action["add"] for action in entry if "add" in action)


def _delete(table: str, add: dict, positions: list[int]) -> bool:
    """Mark ``positions`` of ``add``'s file deleted: its DV file, then (past the failpoint) version 1."""
    from mvsink import failpoints

    actions = dv.delete_rows(table, add, positions, int(time.time() * 1000))
    failpoints.hit("dv-before-commit")
    return log_entry.commit_entry(table, 1, actions, {"operation": "DELETE"})


def test_a_writer_killed_between_its_deletion_vector_and_its_commit_leaves_the_table_as_it_was(spark, tmp_path):
    table = str(tmp_path / "deleted")
    add = _dv_table(table)
    marker = tmp_path / "frozen"
    args = [sys.executable, __file__, "delete", table, json.dumps(add), "2,3,5"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(Path(__file__).parent)])}
    frozen = subprocess.Popen(args, env={**env, "MVSINK_FAILPOINT": "dv-before-commit",
                                         "MVSINK_FAILPOINT_MARKER": str(marker)})
    wait_for(marker.exists, timeout=120, what="the writer to reach its commit")
    os.kill(frozen.pid, signal.SIGKILL)
    frozen.wait()
    assert len(list(Path(table).glob("deletion_vector_*.bin"))) == 1, "its DV file was written"
    everything = Counter((i,) for i in range(10))
    assert DeltaTable(table).version() == 0
    assert rows_by_readers(spark, table, ["id"]) == dict.fromkeys(("Spark", "DuckDB", "delta-rs"), everything)

    assert subprocess.run(args, env=env, timeout=120).returncode == 0
    left = Counter((i,) for i in range(10) if i not in (2, 3, 5))
    assert DeltaTable(table).version() == 1
    assert rows_by_readers(spark, table, ["id"]) == dict.fromkeys(("Spark", "DuckDB", "delta-rs"), left)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from s3_server_fixture(tmp_path_factory)


def test_on_s3_a_version_is_created_once_and_its_deletion_vector_read(s3):
    from helpers import S3_BUCKET

    table = f"s3://{S3_BUCKET}/log-entry"
    options = storage.storage_options(table)
    add = _dv_table(table, options)
    actions = dv.delete_rows(table, add, [0, 9], int(time.time() * 1000))
    assert log_entry.commit_entry(table, 1, actions, {"operation": "DELETE"})
    assert not log_entry.commit_entry(table, 1, [log_entry.txn_action("late", 1, 0)], {"operation": "WRITE"})
    assert DeltaTable(table, storage_options=options).version() == 1
    assert DeltaTable(table, storage_options=options).transaction_version("late") is None
    assert _delta_rs_rows(table, "id", options) == Counter((i,) for i in range(1, 9))


if __name__ == "__main__":
    if sys.argv[1] == "race":
        _race(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        sys.exit(0 if _delete(sys.argv[2], json.loads(sys.argv[3]), [int(p) for p in sys.argv[4].split(",")]) else 1)
