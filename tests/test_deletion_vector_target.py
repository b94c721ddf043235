"""A view whose target has deletion vectors.

* Foreign ones (``deletion_vectors: auto`` on a target without them allowed, so the view rewrites
  files): a foreign ``DELETE`` that writes deletion vectors is read back and repaired, and the
  view's own retractions of rows in files with deletion vectors find only the rows still there and
  remove the logical file with its deletion vector (mvsink's own log entry).
* Its own (``deletion_vectors: on``): retractions are marked in deletion vectors, no file is
  rewritten; a second replica reads every such commit back and finds nothing to correct; the
  compaction rewrites the worn files; VACUUM keeps what the latest version needs.

Spark, DuckDB and delta-rs read the view's rows after every step, and Spark every version the view
committed as the view at the time it holds."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from helpers import commit_sql, create_source, insert, rows_by_readers
from mvsink import MaterializedView, SnapshotInput, ViewDefinition
from mvsink import table as delta_log
from mvsink.append import compact as compaction
from mvsink.append.compact import compact_files
from mvsink.check import TimelineReader
from mvsink.target.guard import allows_deletion_vectors
from mvsink.write import plain, rewrite
from mvsink.write.deletion_vectors import file_uri

QUERY = "SELECT id, v FROM src WHERE id % 2 = 0"


def _checker(spark, view: MaterializedView, src: str, target: str):
    """``exact(after)``: caught up, every reader reads the query's rows; and every version the view
    committed since the last call is the view at the time it holds, as Spark reads it."""
    checked = [0]  # the versions below it are checked

    def exact(after: str) -> None:
        view.run_until_caught_up()
        spark.read.format("delta").load(src).createOrReplaceTempView("src")
        expected = Counter(tuple(r) for r in spark.sql(QUERY).collect())
        assert rows_by_readers(spark, target, ["id", "v"]) == {reader: expected for reader in ("Spark", "DuckDB", "delta-rs")}, \
            f"after {after}"
        timeline = TimelineReader(view.timeline.path)
        latest = delta_log.latest_version(target)
        for version in range(checked[0], latest + 1):
            info = delta_log.commit_info(target, version)
            if info.get("mvsink.view") != view.view.view_id or int(info["mvsink.upper"]) == 0:
                continue
            at = timeline.versions(int(info["mvsink.upper"]) - 1)["src"]
            spark.read.format("delta").option("versionAsOf", at).load(src).createOrReplaceTempView("src")
            want = Counter(tuple(r) for r in spark.sql(QUERY).collect())
            got = Counter(tuple(r) for r in spark.read.format("delta").option("versionAsOf", version).load(target)
                          .select("id", "v").collect())
            assert got == want, f"after {after}: version {version} ({info.get('mvsink.reason')}) has too many " \
                                f"{dict(got - want)}, too few {dict(want - got)}"
        checked[0] = latest + 1

    return exact


def test_a_view_keeps_a_target_with_deletion_vectors_exact(spark, tmp_path):
    src, target = str(tmp_path / "src"), str(tmp_path / "view")
    create_source(spark, src, [(i, f"v{i}") for i in range(40)])
    view = MaterializedView(spark, ViewDefinition("dv_view", target, SnapshotInput(sql=QUERY), key=("id",),
                                                  sources={"src": src}, replica_id="r1", layout="table"))
    exact = _checker(spark, view, src, target)
    exact("the hydration")
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 4 = 0")  # a foreign delete, by deletion vectors
    dvs = [a for a in delta_log.live_files(target, delta_log.latest_version(target)).values() if a.get("deletionVector")]
    assert dvs, "Spark's DELETE wrote deletion vectors"
    exact("a foreign DELETE repaired")

    spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 6 = 2")  # DVs that grow, and on the repair's file
    exact("a second foreign DELETE repaired")
    commit_sql(spark, f"UPDATE delta.`{src}` SET v = concat(v, '+') WHERE id % 3 = 0")
    exact("an UPDATE of the source over files with deletion vectors")
    own = [v for v in range(delta_log.latest_version(target) + 1)
           if delta_log.commit_info(target, v).get("mvsink.view") == "dv_view"
           and any(a.get("add", {}).get("deletionVector") for a in delta_log.log_actions(target, v))]
    assert own, "deletion vectors allowed now (auto): a step of the view marked its retractions in one"
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 10 = 6")
    commit_sql(spark, f"UPDATE delta.`{src}` SET v = concat(v, '*') WHERE id % 4 = 2")
    exact("a foreign DELETE and an UPDATE of the source in one step")
    commit_sql(spark, f"DELETE FROM delta.`{src}` WHERE id < 10")
    insert(spark, src, [(100, "new"), (102, "newer")])
    exact("a DELETE and an insert in the source")

    # Deletion vectors no longer allowed (those there stay): the view rewrites the files holding its
    # retractions, leaving out the rows their vectors delete.
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 8 = 4")
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'false')")
    commit_sql(spark, f"UPDATE delta.`{src}` SET v = concat(v, '#') WHERE id % 4 = 0")
    exact("a third foreign DELETE and an UPDATE of the source, deletion vectors no longer allowed")
    steps = [delta_log.log_actions(target, v) for v in range(delta_log.latest_version(target), 0, -1)
             if delta_log.commit_info(target, v).get("mvsink.reason") not in ("compaction", None)]
    rewrote = next(actions for actions in steps if any("remove" in a for a in actions))
    assert any(a.get("remove", {}).get("deletionVector") for a in rewrote), "it rewrote a file with a deletion vector"
    assert not any(a.get("add", {}).get("deletionVector") for a in rewrote), "and marked nothing"
    compactions = [delta_log.log_actions(target, v) for v in range(delta_log.latest_version(target) + 1)
                   if delta_log.commit_info(target, v).get("mvsink.reason") == "compaction"]
    assert any(a.get("remove", {}).get("deletionVector") for actions in compactions for a in actions), \
        "the upkeep's compaction rewrote files with deletion vectors"


def test_a_prune_value_settles_a_retraction_only_where_it_is_unambiguous(tmp_path):
    """The key alone finds a retraction's copies where exactly `k` live rows have its prune value;
    two rows with one value, or a deleted one among them, are left to compare whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 1, 2, 3, 4, 4], "v": ["a", "b", "c", "d", "e", "e"]}), tmp_path / "f.parquet")
    files = [rewrite.TableFile("f.parquet", 1)]
    retractions = pa.table({"id": [1, 2, 4, 5], "v": ["a", "c", "e", "z"], rewrite.COPIES: [1, 1, 2, 1]})
    positions, unsettled = rewrite._settled_by_prune_value(str(tmp_path), files, retractions, "id")
    assert positions == {"f.parquet": [2, 4, 5]} and unsettled == [0, 3], (positions, unsettled)


@pytest.mark.parametrize("path", ["driver", "whole-rows-in-tasks", "spark-join"])
def test_a_view_marks_its_retractions_in_deletion_vectors(spark, tmp_path, monkeypatch, path):
    """``deletion_vectors: on``: every step's retractions are marked in deletion vectors of the
    files holding them (found by the key alone on the driver, by whole rows in Spark tasks, or by
    a Spark join), which keep every row; a second replica reading each commit back finds nothing
    to correct."""
    if path == "whole-rows-in-tasks":
        monkeypatch.setattr(rewrite, "DRIVER_REWRITE_BYTES", 0)
        monkeypatch.setattr(rewrite, "_settled_by_prune_value",
                            lambda target, files, retractions, column: ({}, list(range(retractions.num_rows))))
    if path == "spark-join":
        monkeypatch.setattr(plain, "GATHERED_UPDATES", 0)
    monkeypatch.setattr(compaction, "DELETED_SHARE", 2.0)  # no file worn: each step's marks stay to be seen
    src, target = str(tmp_path / "src"), str(tmp_path / "view")
    create_source(spark, src)
    spark.createDataFrame([(i, f"v{i}") for i in range(300)], "id BIGINT, v STRING").coalesce(1).write.format(
        "delta").mode("append").save(src)

    def replica(name: str) -> MaterializedView:
        return MaterializedView(spark, ViewDefinition("marks", target, SnapshotInput(sql=QUERY), key=("id",),
                                                      sources={"src": src}, replica_id=name, deletion_vectors="on"))

    view = replica("r1")
    exact = _checker(spark, view, src, target)
    exact("the hydration")
    assert allows_deletion_vectors(view.shard.table()), "the view created its target with deletion vectors allowed"
    second = replica("r2")
    second.run_until_caught_up()

    def step(change, after: str) -> list[dict]:
        """``change`` to the source, the view caught up and exact, then the second replica caught
        up without a commit; the actions of the view's last commit."""
        before = set(delta_log.live_files(target, delta_log.latest_version(target)))
        change()
        exact(after)
        latest = delta_log.latest_version(target)
        actions = delta_log.log_actions(target, latest)
        marked = [a["add"] for a in actions if "add" in a and a["add"].get("deletionVector")]
        assert marked and {a["path"] for a in marked} <= before, f"after {after}: retractions marked in old files"
        assert set(delta_log.live_files(target, latest)) >= before, f"after {after}: no file rewritten"
        second.run_until_caught_up()
        assert delta_log.latest_version(target) == latest, f"after {after}: the second replica read it back exact"
        return actions

    step(lambda: commit_sql(spark, f"UPDATE delta.`{src}` SET v = concat(v, '+') WHERE id % 3 = 0"),
         "an UPDATE of the source")
    step(lambda: commit_sql(spark, f"DELETE FROM delta.`{src}` WHERE id < 40"), "a DELETE of the source")
    actions = step(lambda: commit_sql(spark, f"UPDATE delta.`{src}` SET v = concat(v, '*') WHERE id % 4 = 2"),
                   "an UPDATE over rows deleted and marked before")
    assert any(a.get("remove", {}).get("deletionVector") for a in actions), "a vector grew"

    # The one file has most of its rows deleted now: the compaction rewrites it without them.
    monkeypatch.setattr(compaction, "DELETED_SHARE", 0.1)
    worn = compaction.worn_files(view.shard, view.shard.table())
    assert worn, "the file is worn"
    compacted = compact_files(spark, view.shard, view.schema, view.readback.error_files, key=["id"])
    assert {path for path, _ in worn} <= set(compacted.removed)
    exact("a compaction of the worn file")
    monkeypatch.setattr(compaction, "DELETED_SHARE", 2.0)
    commit_sql(spark, f"DELETE FROM delta.`{src}` WHERE id % 8 = 6")
    exact("a DELETE after the compaction")
    second.run_until_caught_up()
    vectors = [file_uri(target, a["deletionVector"]) for a in delta_log.live_files(
        target, delta_log.latest_version(target)).values() if a.get("deletionVector")]
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{target}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    assert vectors and all(os.path.exists(v) for v in vectors), "VACUUM kept the vectors the table uses"
    exact("VACUUM")
