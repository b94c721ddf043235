"""The read-back of a table with deletion vectors (:mod:`mvsink.correction.readback`): it follows
logical files, so rows deleted by a deletion vector, Spark's or ours, come back as their
retraction, and what it has read back is always the table's rows as Spark reads them."""

from __future__ import annotations

import time
from collections import Counter

from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink import table as delta_log
from mvsink.append import Shard, log_entry
from mvsink.correction.readback import ReadBack
from mvsink.target.layout import TABLE, UPDATES
from mvsink.updates import DIFF, table_schema
from mvsink.write import deletion_vectors as dv

USER = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType())])


def _signed(updates) -> Counter:
    """(id, name) -> the sum of its diffs in ``updates`` (negative ones kept)."""
    return Counter({(r["id"], r["name"]): r["n"]
                    for r in updates.groupBy("id", "name").agg(F.sum(DIFF).alias("n")).collect()})


def test_the_read_back_follows_rows_deleted_by_deletion_vectors(spark, tmp_path):
    target = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{target}` (id BIGINT, name STRING) USING delta "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    for start in (0, 20, 40):
        (spark.range(start, start + 20, numPartitions=1).selectExpr("id", "concat('n', id) AS name")
         .write.format("delta").mode("append").save(target))
    shard = Shard(target, app_id="mvsink-test", view_id="v", replica_id="r")
    shard.deletion_vectors = True
    readback = ReadBack(spark, shard, table_schema(USER), TABLE)
    held: Counter = Counter()

    def poll_and_compare(what: str) -> Counter:
        """Fold the poll's updates into what was read back; it must be what Spark reads now."""
        persisted = readback.poll()
        change = _signed(persisted.updates) if persisted.updates is not None else Counter()
        for row, n in change.items():
            held[row] += n
        now = Counter(tuple(r) for r in spark.read.format("delta").load(target).select("id", "name").collect())
        assert +held == now and not -held, f"after {what}: read back {+held}, the table {now}"
        return change

    assert sum(poll_and_compare("three appends").values()) == 60
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 3 = 0")  # Spark's DVs in every file
    assert any(a.get("deletionVector") for a in delta_log.live_files(target, delta_log.latest_version(target)).values())
    poll_and_compare("Spark's DELETE")
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 5 = 0")  # the DVs grow
    poll_and_compare("a second DELETE")

    live = delta_log.live_files(target, delta_log.latest_version(target))
    path, add = next(iter(live.items()))
    version = delta_log.latest_version(target) + 1
    assert log_entry.commit_entry(target, version, dv.delete_rows(target, add, [1, 2, 4], int(time.time() * 1000)),
                                  {"operation": "DELETE"})  # ours, over Spark's DV
    poll_and_compare("our DV")
    spark.sql(f"UPDATE delta.`{target}` SET name = concat(name, '+') WHERE id % 7 = 0")
    poll_and_compare("an UPDATE")
    assert readback.poll().updates is None, "nothing changed: nothing read"



def test_a_foreign_deletion_by_deletion_vectors_has_its_undo(spark, tmp_path):
    """In the update layout a foreign commit is undone by a repair: the undo of a DELETE that
    wrote deletion vectors is the deleted rows (the rows under the old DVs less those under the
    new), each +1, at its time."""
    target = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{target}` (id BIGINT, name STRING) USING delta "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    (spark.range(0, 30, numPartitions=2).selectExpr("id", "concat('n', id) AS name")
     .write.format("delta").mode("append").save(target))
    shard = Shard(target, app_id="mvsink-test", view_id="v", replica_id="r")
    shard.deletion_vectors = True
    readback = ReadBack(spark, shard, table_schema(USER), UPDATES)
    readback.poll()
    for n in (4, 6):  # the second one over the first's DVs
        spark.sql(f"DELETE FROM delta.`{target}` WHERE id % {n} = 1")
        persisted = readback.poll()
        (version, undo), = persisted.foreign.items()
        assert any(a.get("remove", {}).get("deletionVector") or a.get("add", {}).get("deletionVector")
                   for a in delta_log.log_actions(target, version)), "the DELETE wrote deletion vectors"
        deleted = {i for i in range(30) if i % n == 1 and not (n == 6 and i % 4 == 1)}
        assert _signed(undo) == Counter({(i, f"n{i}"): 1 for i in deleted})
