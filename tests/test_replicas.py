"""Replicas as separate processes on one source and target, restarted at random."""

from __future__ import annotations

import random

import pytest
from deltalake import DeltaTable

from helpers import (Replica, commit_sql, create_source, edit_with_restarts, insert, read_plainly_at_every_time,
                     stop_all, view_upper_of, wait_for, write_config)
from mvsink import table as delta_log
from mvsink.check import caught_up, check_table, expected_from_source
from mvsink.view import resolve_function

SOURCE_VERSIONS = 24
#: Three race in test_timeline_replicas (a view over three sources).
REPLICAS = 2
#: Each replica killed once, one with SIGKILL and one with SIGTERM (a third restart showed nothing new).
RESTARTS = 2

TRANSFORM = '''
def shout(row):
    """Keep even ids, upper-case v."""
    if row["id"] % 2:
        return None
    return {"id": row["id"], "v": row["v"].upper()}
'''


def _edit(spark, src, rng: random.Random, version: int, next_id: list[int]) -> None:
    op = rng.choice(["insert", "insert", "update", "delete"])
    if op == "insert":
        rows = [(next_id[0] + i, f"r{version}-{i}") for i in range(rng.randint(1, 4))]
        next_id[0] += len(rows)
        insert(spark, src, rows)
    elif op == "update":
        commit_sql(spark, f"UPDATE delta.`{src}` SET v = concat(v, '+{version}') WHERE id % 3 = {version % 3}")
    else:
        commit_sql(spark, f"DELETE FROM delta.`{src}` WHERE id % 7 = {version % 7}")


@pytest.mark.parametrize("deletion_vectors", ["auto", "on"])
def test_replicas_with_random_restarts_keep_the_table_exact(spark, tmp_path, deletion_vectors):
    """``auto`` on a new target: files rewritten; ``on``: retractions marked in deletion vectors."""
    rng = random.Random(1000 + REPLICAS)
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    (tmp_path / "transform.py").write_text(TRANSFORM)
    create_source(spark, src, [(i, f"r0-{i}") for i in range(10)])
    config = write_config(tmp_path / "view.yaml", view_id="shouty", target=tgt, key=["id"],
                          input={"kind": "changes", "source": src, "map_row": "transform.py:shout",
                                 "output_schema": "id BIGINT, v STRING"}, deletion_vectors=deletion_vectors)
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = [Replica(config, f"r{i}", logs).start() for i in range(REPLICAS)]
    restarts = 0
    try:
        wait_for(lambda: view_upper_of(tgt, "shouty"), timeout=240, what="the first commit", watch=tuple(fleet))
        next_id = [100]
        restarts = edit_with_restarts(fleet, rng, SOURCE_VERSIONS, RESTARTS,
                                      lambda n: _edit(spark, src, rng, n, next_id), tgt, "shouty")
        wait_for(lambda: caught_up(tgt, "shouty"), timeout=300,
                 what=f"the view to reach source version {DeltaTable(src).version()}", watch=tuple(fleet))
    finally:
        stop_all(fleet)

    shout = resolve_function("transform.py:shout", tmp_path)
    expected = expected_from_source(src, ["id", "v"], shout, timeline=tgt + "_timeline")
    result = check_table(tgt, "shouty", ["id", "v"], expected)
    print(f"{REPLICAS} replicas, {restarts} restarts, source versions {DeltaTable(src).version()}: "
          f"{result.summary()}")
    assert result.ok, result.problems[:5]
    assert restarts == RESTARTS
    assert result.times_checked >= view_upper_of(tgt, "shouty"), "every time, at the version that holds it (a compaction's version again)"
    writers = {replica for _, _, reason, replica in result.commits if reason != "advance-upper"}
    assert len(writers) >= 2, f"only {writers} ever won a commit: the replicas did not race"
    # readers that know nothing of mvsink, at the version that holds each time
    times, versions = read_plainly_at_every_time(spark, tgt, "shouty", ["id", "v"], expected)
    assert times == view_upper_of(tgt, "shouty") and versions > 1, (times, versions)
    marked = [v for v in range(delta_log.latest_version(tgt) + 1)
              if any(a.get("add", {}).get("deletionVector") for a in delta_log.log_actions(tgt, v))]
    assert bool(marked) == (deletion_vectors == "on"), f"versions with rows marked deleted: {marked}"
