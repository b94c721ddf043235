"""A change-feed view whose source's change data cannot be read for a range (made so by delta-spark):
the view falls back to the source's snapshots and stays exact at every time, or stops with an error
naming the versions, having written nothing; it never skips or misapplies a change."""

from __future__ import annotations

import logging
import shutil

import pytest
from deltalake import DeltaTable

from helpers import create_source, insert, query_results_at_every_time, vacuum_all
from mvsink import ChangesInput, MaterializedView, ViewDefinition
from mvsink.check import check_table, expected_from_source
from mvsink.desired.changes import SourceChangesLost, SourceSchemaChanged
from mvsink.table import latest_version

COLUMNS = ["id", "v"]


def _running_view(spark, tmp_path, as_of: int = 0) -> tuple[str, str, MaterializedView]:
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    if latest_version(src) is None:
        create_source(spark, src, [(1, "a"), (2, "b"), (3, "c")])
    mv = MaterializedView(spark, ViewDefinition("feed", tgt, ChangesInput(src), key=("id",), replica_id="r1",
                                                as_of=as_of))
    mv.run_until_caught_up()
    return src, tgt, mv


def _assert_exact(src: str, tgt: str) -> None:
    result = check_table(tgt, "feed", COLUMNS, expected_from_source(src, COLUMNS, timeline=tgt + "_timeline"))
    assert result.ok, result.problems[:5]
    assert result.times_checked >= 2


@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["files", "deletion-vectors"])
def test_change_data_feed_turned_off_and_on_stays_exact(spark, tmp_path, caplog, deletion_vectors):
    """Commits made with the feed off are read from the log's added and removed files; where an
    UPDATE or DELETE wrote deletion vectors instead, from the source's snapshots."""
    src, tgt, mv = _running_view(spark, tmp_path)
    spark.sql(f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false, "
              f"delta.enableDeletionVectors = {str(deletion_vectors).lower()})")
    spark.sql(f"UPDATE delta.`{src}` SET v = 'changed while the feed was off' WHERE id = 2")
    spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 3")
    spark.sql(f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    insert(spark, src, [(4, "d")])
    with caplog.at_level(logging.WARNING, logger="mvsink.desired"):
        mv.run_until_caught_up()
    from_snapshots = "DELTA_MISSING_CHANGE_DATA" in caplog.text and "from snapshots instead" in caplog.text
    assert from_snapshots == deletion_vectors, caplog.text
    insert(spark, src, [(5, "e")])  # and the feed is used again afterwards
    mv.run_until_caught_up()
    if deletion_vectors:  # the checker reads the source with deltalake, which cannot read them: Spark does
        query_results_at_every_time(spark, src, "SELECT * FROM src", {"feed": tgt}, tgt + "_timeline",
                                    mv.observed_upper, ("id",))
    else:
        _assert_exact(src, tgt)


def test_a_restore_of_the_source_is_followed_exactly(spark, tmp_path):
    src, tgt, mv = _running_view(spark, tmp_path)
    restore_to = DeltaTable(src).version()
    spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 1")
    mv.run_until_caught_up()
    insert(spark, src, [(4, "d")])
    spark.sql(f"UPDATE delta.`{src}` SET v = 'x' WHERE id = 2")
    spark.sql(f"RESTORE TABLE delta.`{src}` TO VERSION AS OF {restore_to}")
    mv.run_until_caught_up()
    _assert_exact(src, tgt)
    assert sorted(DeltaTable(src).to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == \
        [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "c"}]


def test_a_column_type_change_in_the_source_stops_the_view_naming_it(spark, tmp_path):
    src, tgt, mv = _running_view(spark, tmp_path)
    before = DeltaTable(tgt).version()
    (spark.createDataFrame([(1, 5)], "id BIGINT, v INT").write.format("delta").mode("overwrite")
     .option("overwriteSchema", "true").save(src))
    with pytest.raises(SourceSchemaChanged, match=r"changed columns at version \d+: v string -> int"):
        mv.foreach_batch(None, 0)  # a configuration error: the stream stops, no retry loop
    assert DeltaTable(tgt).version() == before, "nothing written"


def test_vacuumed_change_data_stops_the_view_and_a_rebuild_at_the_named_time_works(spark, tmp_path):
    src, tgt, mv = _running_view(spark, tmp_path)
    spark.sql(f"UPDATE delta.`{src}` SET v = 'y' WHERE id = 3")
    vacuum_all(spark, src)
    before = DeltaTable(tgt).version()
    with pytest.raises(SourceChangesLost, match=r"FILE_NOT_EXIST.*VACUUM.*as_of (\d+)") as lost:
        mv.step()
    assert DeltaTable(tgt).version() == before, "nothing written"
    as_of = int(str(lost.value).rsplit("as_of ", 1)[1].split(",")[0])
    shutil.move(tgt, str(tmp_path / "old-target"))
    _, _, rebuilt = _running_view(spark, tmp_path, as_of=as_of)
    assert rebuilt.shard.upper() == as_of + 1
    result = check_table(tgt, "feed", COLUMNS, expected_from_source(src, COLUMNS, timeline=tgt + "_timeline"),
                         as_of=as_of)
    assert result.ok and result.times_checked >= 1, result.problems[:5]
