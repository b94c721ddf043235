"""A view whose target has deletion vectors (a shard that allows them, :attr:`Shard.deletion_vectors`):
a foreign ``DELETE`` that writes deletion vectors is read back and repaired, and the view's own
retractions of rows in files with deletion vectors find only the rows still there and remove the
logical file with its deletion vector (mvsink's own log entry). Spark, DuckDB and delta-rs read the
view's rows after every step."""

from __future__ import annotations

from collections import Counter

from helpers import commit_sql, create_source, insert, rows_by_readers
from mvsink import MaterializedView, SnapshotInput, ViewDefinition
from mvsink import table as delta_log
from mvsink.append.compact import compact_files
from mvsink.check import TimelineReader

QUERY = "SELECT id, v FROM src WHERE id % 2 = 0"


def test_a_view_keeps_a_target_with_deletion_vectors_exact(spark, tmp_path):
    src, target = str(tmp_path / "src"), str(tmp_path / "view")
    create_source(spark, src, [(i, f"v{i}") for i in range(40)])
    view = MaterializedView(spark, ViewDefinition("dv_view", target, SnapshotInput(sql=QUERY), key=("id",),
                                                  sources={"src": src}, replica_id="r1", layout="table"))
    view.shard.deletion_vectors = True

    checked = [0]  # the versions below it are checked

    def exact(after: str) -> None:
        """Caught up: every reader reads the query's rows; and every version the view committed
        since the last call is the view at the time it holds, as Spark reads it."""
        view.run_until_caught_up()
        spark.read.format("delta").load(src).createOrReplaceTempView("src")
        expected = Counter(tuple(r) for r in spark.sql(QUERY).collect())
        assert rows_by_readers(spark, target, ["id", "v"]) == {reader: expected for reader in ("Spark", "DuckDB", "delta-rs")}, \
            f"after {after}"
        timeline = TimelineReader(view.timeline.path)
        latest = delta_log.latest_version(target)
        for version in range(checked[0], latest + 1):
            info = delta_log.commit_info(target, version)
            if info.get("mvsink.view") != "dv_view" or int(info["mvsink.upper"]) == 0:
                continue
            at = timeline.versions(int(info["mvsink.upper"]) - 1)["src"]
            spark.read.format("delta").option("versionAsOf", at).load(src).createOrReplaceTempView("src")
            want = Counter(tuple(r) for r in spark.sql(QUERY).collect())
            got = Counter(tuple(r) for r in spark.read.format("delta").option("versionAsOf", version).load(target)
                          .select("id", "v").collect())
            assert got == want, f"after {after}: version {version} ({info.get('mvsink.reason')}) has too many " \
                                f"{dict(got - want)}, too few {dict(want - got)}"
        checked[0] = latest + 1

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
           and delta_log.commit_info(target, v).get("mvsink.reason") != "repair"
           and any(a.get("remove", {}).get("deletionVector") for a in delta_log.log_actions(target, v))]
    assert own, "a step of the view (not a repair) removed a file with its deletion vector"
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 10 = 6")
    commit_sql(spark, f"UPDATE delta.`{src}` SET v = concat(v, '*') WHERE id % 4 = 2")
    exact("a foreign DELETE and an UPDATE of the source in one step")
    commit_sql(spark, f"DELETE FROM delta.`{src}` WHERE id < 10")
    insert(spark, src, [(100, "new"), (102, "newer")])
    exact("a DELETE and an insert in the source")

    spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 8 = 4")
    exact("a third foreign DELETE repaired")
    compacted = compact_files(spark, view.shard, view.schema, view.readback.error_files, key=["id"])
    assert compacted.version is not None and any(
        a.get("remove", {}).get("deletionVector") for a in delta_log.log_actions(target, compacted.version)), \
        "the compaction rewrote files with deletion vectors"
    exact("a compaction of files with deletion vectors")
