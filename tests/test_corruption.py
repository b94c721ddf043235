"""Damage done behind mvsink's back is repaired at once, with every source idle. In the table layout
the view's history is Delta's: every version mvsink committed still reads as the view at its
times, the damaged version is no version of the view, and the repair is the next version. In the
update layout the repair restores the view's history exactly in the latest version: every time in
`[since, upper)`, not only from the repair on."""

from __future__ import annotations

from collections import Counter

import pytest
from deltalake import DeltaTable

from helpers import create_source, insert
from mvsink import ChangesInput, MaterializedView, ViewDefinition, read_view
from mvsink.check import TimelineReader, check_table, expected_from_source, table_at
from mvsink.target.read import version_of_time


def _append(spark, tgt, upper, plain):
    if plain:
        spark.sql(f"INSERT INTO delta.`{tgt}` VALUES (99, 'bogus'), (3, 'w3'), (98, NULL)")
        return
    """Bogus rows: at a past time, at a future one, and without time or diff (read as time 0)."""
    spark.sql(f"INSERT INTO delta.`{tgt}` VALUES (99, 'bogus', NULL, 1, 1), (3, 'v3', NULL, 0, 5), "
              f"(97, 'from the future', NULL, {upper + 2}, 1)")
    spark.sql(f"INSERT INTO delta.`{tgt}` (id, v) VALUES (98, 'no time, no diff')")


def _delete(spark, tgt, upper, plain):
    spark.sql(f"DELETE FROM delta.`{tgt}` WHERE id IN (2, 6)")


def _update(spark, tgt, upper, plain):
    if plain:
        spark.sql(f"UPDATE delta.`{tgt}` SET v = 'evil' WHERE id IN (3, 7)")
        return
    spark.sql(f"UPDATE delta.`{tgt}` SET v = 'evil', _mv_time = 0 WHERE id IN (3, 7)")


def _overwrite(spark, tgt, upper, plain):
    if plain:
        spark.createDataFrame([(1, "junk")], "id BIGINT, v STRING").write.format("delta").mode("overwrite").save(tgt)
        return
    garbage = spark.createDataFrame([(1, "junk", None, 0, 1)], "id BIGINT, v STRING, _mv_error STRING, "
                                                                "_mv_time BIGINT, _mv_diff BIGINT")
    garbage.write.format("delta").mode("overwrite").save(tgt)


def _view_with_history(spark, tmp_path, layout: str):
    """A keyed view of a source with a history of four times, caught up; the source, the target,
    the view and the expected rows at each time."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, f"v{i}") for i in range(1, 6)])
    view = ViewDefinition("fix", tgt, ChangesInput(src), key=("id",), replica_id="r1", layout=layout)
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    for row in [(6, "v6"), (7, "v7")]:
        insert(spark, src, [row])
        mv.run_until_caught_up()
    spark.sql(f"UPDATE delta.`{src}` SET v = 'w3' WHERE id = 3")
    mv.run_until_caught_up()
    return src, tgt, mv, expected_from_source(src, ["id", "v"], timeline=view.timeline)


@pytest.mark.parametrize("damage", [_append, _delete, _update, _overwrite], ids=lambda d: d.__name__[1:])
def test_damage_with_idle_sources_is_repaired_within_two_steps_history_kept(spark, tmp_path, damage):
    src, tgt, mv, expected = _view_with_history(spark, tmp_path, "table")
    source_version, timeline = DeltaTable(src).version(), TimelineReader(mv.view.timeline)
    upper = DeltaTable(tgt).transaction_version("mvsink:fix")
    before = {t: version_of_time(tgt, "fix", t) for t in range(upper)}

    damage(spark, tgt, upper, True)
    damaged_at = DeltaTable(tgt).version()
    now = DeltaTable(tgt).to_pyarrow_table()
    assert Counter(zip(now.column("id").to_pylist(), now.column("v").to_pylist())) != expected(upper - 1)

    mv.step()
    mv.step()
    assert DeltaTable(src).version() == source_version, "no source commit was needed"
    repaired_upper = DeltaTable(tgt).transaction_version("mvsink:fix")
    now = DeltaTable(tgt).to_pyarrow_table()
    assert Counter(zip(now.column("id").to_pylist(), now.column("v").to_pylist())) == expected(repaired_upper - 1)
    result = check_table(tgt, "fix", ["id", "v"], expected)
    assert result.ok and result.foreign_versions == [damaged_at], result.problems
    assert {t: version_of_time(tgt, "fix", t) for t in range(upper)} == before, "history as it was"
    repair = next(h for h in table_at(tgt).history() if h.get("mvsink.reason") == "repair")
    assert damaged_at in repair["mvsink.repairs"]
    repair_time = int(repair["mvsink.lower"])
    assert repair_time == upper and repaired_upper == upper + 1
    assert timeline.versions(repair_time) == timeline.versions(repair_time - 1), "a repair time, same versions"
    for row in [(8, "v8"), (9, "v9")]:
        insert(spark, src, [row])
        mv.run_until_caught_up()
    final = check_table(tgt, "fix", ["id", "v"], expected)
    assert final.ok, final.problems
    assert {r.id for r in read_view(spark, tgt, "fix").collect()} == {1, 2, 3, 4, 5, 6, 7, 8, 9}


@pytest.mark.parametrize("damage", [_append, _update], ids=lambda d: d.__name__[1:])
def test_damage_in_the_update_layout_is_repaired_in_history_within_two_steps(spark, tmp_path, damage):
    src, tgt, mv, expected = _view_with_history(spark, tmp_path, "updates")
    source_version, timeline = DeltaTable(src).version(), TimelineReader(mv.view.timeline)

    damage(spark, tgt, DeltaTable(tgt).transaction_version("mvsink:fix"), False)
    damaged_at = DeltaTable(tgt).version()
    damaged = check_table(tgt, "fix", ["id", "v"], expected, from_version=damaged_at)
    assert not damaged.ok, "the damage makes some time wrong"

    mv.step()
    mv.step()
    assert DeltaTable(src).version() == source_version, "no source commit was needed"
    last = DeltaTable(tgt).version()
    repaired = check_table(tgt, "fix", ["id", "v"], expected, from_version=last)
    assert repaired.ok, repaired.problems
    assert repaired.times_checked == DeltaTable(tgt).transaction_version("mvsink:fix"), "every time, from 0"
    repair = next(h for h in table_at(tgt).history() if h.get("mvsink.reason") == "repair")
    assert damaged_at in repair["mvsink.repairs"] and repair["mvsink.history_updates"] > 0
    repair_time = int(repair["mvsink.lower"])
    assert timeline.versions(repair_time) == timeline.versions(repair_time - 1), "a repair time, same versions"

    # The table stays right from there on, also once the upper passes a bogus future time.
    for row in [(8, "v8"), (9, "v9"), (10, "v10")]:
        insert(spark, src, [row])
        mv.run_until_caught_up()
    final = check_table(tgt, "fix", ["id", "v"], expected, from_version=DeltaTable(tgt).version())
    assert final.ok, final.problems
    assert {r.id for r in read_view(spark, tgt, "fix").collect()} == {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
