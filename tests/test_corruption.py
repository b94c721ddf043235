"""Damage done behind mvsink's back is corrected by the next batch, and the repair says so."""

from __future__ import annotations

from collections import Counter

from deltalake import DeltaTable

from helpers import create_source, insert
from mvsink import ChangesInput, MaterializedView, ViewDefinition, read_view
from mvsink.check import expected_from_source


def _latest_commit(tgt):
    return DeltaTable(tgt).history(1)[0]


def _assert_view_is_source(spark, src, tgt):
    expected = expected_from_source(src, ["id", "v"])
    upper = DeltaTable(tgt).transaction_version("mvsink:fix")
    got = Counter(tuple(r) for r in read_view(spark, tgt, "fix").collect())
    assert got == expected(upper - 1)


def _damage_then_repair(spark, src, tgt, mv, damage, new_row):
    damage()
    damaged_at = DeltaTable(tgt).version()
    insert(spark, src, [new_row])           # the next source version: a time to write the repair at
    mv.run_until_caught_up()
    _assert_view_is_source(spark, src, tgt)
    repairs = [h for h in DeltaTable(tgt).history(5) if h.get("mvsink.reason") == "repair"]
    assert repairs, "the correcting commit is marked as a repair"
    assert damaged_at in repairs[0]["mvsink.repairs"]
    return repairs[0]


def test_bogus_rows_delete_and_overwrite_are_all_corrected(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, f"v{i}") for i in range(1, 6)])
    mv = MaterializedView(spark, ViewDefinition("fix", tgt, ChangesInput(src), key=("id",), replica_id="r1"))
    mv.run_until_caught_up()
    _assert_view_is_source(spark, src, tgt)

    def bogus_rows():
        spark.sql(f"INSERT INTO delta.`{tgt}` VALUES (99, 'bogus', NULL, 1, 1), (3, 'v3', NULL, 0, 5)")
        spark.sql(f"INSERT INTO delta.`{tgt}` (id, v) VALUES (98, 'no time, no diff')")

    _damage_then_repair(spark, src, tgt, mv, bogus_rows, (6, "v6"))

    def delete():
        spark.sql(f"DELETE FROM delta.`{tgt}` WHERE id IN (2, 6)")

    _damage_then_repair(spark, src, tgt, mv, delete, (7, "v7"))

    def overwrite():
        garbage = spark.createDataFrame([(1, "junk", None, 0, 1)], "id BIGINT, v STRING, _mv_error STRING, "
                                                                    "_mv_time BIGINT, _mv_diff BIGINT")
        garbage.write.format("delta").mode("overwrite").save(tgt)

    repair = _damage_then_repair(spark, src, tgt, mv, overwrite, (8, "v8"))
    assert repair["mvsink.replica"] == "r1"
    # After the repairs, ordinary corrections are ordinary again.
    insert(spark, src, [(9, "v9")])
    mv.run_until_caught_up()
    assert _latest_commit(tgt)["mvsink.reason"] == "correction"
    _assert_view_is_source(spark, src, tgt)
