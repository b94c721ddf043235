"""State held in Spark's block manager lost (issue 26: executors come and go): a replica whose
locally checkpointed state is gone recovers by itself, hydrating again, and writes the table
exactly. Here the blocks are dropped by unpersisting them, as an executor's death drops its own;
``tests/test_cluster.py`` kills a real executor."""

from __future__ import annotations

import logging

from deltalake import DeltaTable

from helpers import create_source, insert
from mvsink import ChangesInput, MaterializedView, ViewDefinition
from mvsink.check import check_table, expected_from_source


def _drop_held_blocks(spark) -> int:
    """Unpersist every persisted RDD (local checkpoints among them); returns how many."""
    rdds = list(spark.sparkContext._jsc.getPersistentRDDs().values())
    for rdd in rdds:
        rdd.unpersist(True)
    return len(rdds)


def test_a_replica_whose_held_state_is_lost_hydrates_again(spark, tmp_path, caplog):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, f"v{i}") for i in range(20)])
    definition = dict(view_id="lost", target=tgt, input=ChangesInput(src), key=("id",))
    blue = MaterializedView(spark, ViewDefinition(**definition, replica_id="blue"))
    green = MaterializedView(spark, ViewDefinition(**definition, replica_id="green", read_only=True))
    blue.run_until_caught_up()
    green.step()
    # The table is damaged: green's buffer holds the repair, blue's too; then the blocks go.
    spark.sql(f"DELETE FROM delta.`{tgt}` WHERE id < 5")
    green.step()
    assert green.correction.size == 5
    insert(spark, src, [(100, "new")])
    blue.step()  # blue mints the time and writes (repairing too)
    hydrations = green.hydrations
    assert _drop_held_blocks(spark) > 0
    insert(spark, src, [(101, "newer")])
    with caplog.at_level(logging.WARNING, logger="mvsink.sink"):
        failures = 0
        for _ in range(4):
            try:
                blue.step()
            except Exception:
                failures += 1
            try:
                green.step()
            except Exception:
                failures += 1
    assert failures >= 1, "a step needed a lost block"
    assert "was lost with it" in caplog.text and "recovered from the lost executor state in" in caplog.text
    assert green.hydrations > hydrations
    blue.run_until_caught_up()
    green.allow_writes()
    green.run_until_caught_up()
    result = check_table(tgt, "lost", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=tgt + "_timeline"),
                         from_version=DeltaTable(tgt).version())
    assert result.ok, result.problems
