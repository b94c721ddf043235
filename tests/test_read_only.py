"""A read-only replica writes nothing, keeps its corrections current, and takes over when allowed."""

from __future__ import annotations

import os

from deltalake import DeltaTable

from helpers import create_source, insert
from mvsink import ChangesInput, MaterializedView, ViewDefinition
from mvsink.check import caught_up, check_table, expected_from_source


def test_read_only_replica_takes_over_without_loss_or_duplicates(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b")])
    definition = dict(view_id="bg", target=tgt, input=ChangesInput(src), key=("id",))
    blue = MaterializedView(spark, ViewDefinition(**definition, replica_id="blue"))
    green = MaterializedView(spark, ViewDefinition(**definition, replica_id="green", read_only=True))

    # Green starts before the table exists and must not create it, nor its timeline.
    green.step()
    report = green.step()
    assert report.desc is None and not os.path.exists(tgt) and not os.path.exists(tgt + "_timeline")
    assert green.frontier() is None, "no time minted yet: nothing to compute"
    blue.run_until_caught_up()
    report = green.step()
    assert report.desc is None and report.corrections == 0, "hydrated: the table is what it computes"
    for i in range(3, 7):
        insert(spark, src, [(i, f"v{i}")])
        blue.step()
        report = green.step()
        assert report.desc is None
    blue.run_until_caught_up()
    report = green.step()
    assert report.corrections == 0 and green.frontier() == blue.frontier(), "green's buffer is current"
    # Green's buffer differs from the table: it shows what green would write (here: damage).
    spark.sql(f"DELETE FROM delta.`{tgt}` WHERE id = 2")
    version_before = DeltaTable(tgt).version()
    report = green.step()
    assert report.desc is None and report.corrections == 1 and report.minted_time is None
    # Blue stops; the source moves on; green writes nothing and mints no time while read-only.
    spark.sql(f"UPDATE delta.`{src}` SET v = 'bb' WHERE id = 2")
    spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 1")
    report = green.step()
    assert report.desc is None and report.minted_time is None
    assert DeltaTable(tgt).version() == version_before
    assert not [f for f in os.listdir(tgt) if "-green-" in f], "read-only leaves no file"
    assert not [f for f in os.listdir(tgt + "_timeline") if "-green-" in f], "read-only mints no time"
    green.allow_writes()
    report = green.run_until_caught_up()
    assert not green.read_only
    history = [h for h in reversed(DeltaTable(tgt).history()) if h.get("mvsink.view") == "bg"]
    writers = [h["mvsink.replica"] for h in history]
    assert "green" in writers and writers.index("green") > max(i for i, w in enumerate(writers) if w == "blue")
    result = check_table(tgt, "bg", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=tgt + "_timeline"),
                         from_version=DeltaTable(tgt).version())
    assert result.ok, result.problems
    assert caught_up(tgt, "bg")
