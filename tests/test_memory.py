"""The view never passes through the driver: a view far larger than what the driver may collect."""

from __future__ import annotations

import signal

from deltalake import DeltaTable

from helpers import Replica, wait_for, write_config

ROWS = 300_000
WIDTH = 200  # bytes of payload per row: ~60 MB of view against a 1 MB result limit


def test_view_larger_than_the_driver_result_limit(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    (spark.range(ROWS).selectExpr("id", f"repeat(cast(id AS STRING), {WIDTH} DIV 6) AS payload")
     .write.format("delta").option("delta.enableChangeDataFeed", "true").save(src))
    config = write_config(tmp_path / "view.yaml", view_id="big", target=tgt, key=["id"],
                          input={"kind": "changes", "source": src})
    logs = tmp_path / "logs"
    logs.mkdir()
    limit = {"PYSPARK_SUBMIT_ARGS": "--conf spark.driver.maxResultSize=1m pyspark-shell"}
    replica = Replica(config, "r0", logs, env=limit).start()
    try:
        wait_for(lambda: DeltaTable.is_deltatable(tgt)
                 and DeltaTable(tgt).transaction_version("mvsink:big") == 1,
                 timeout=400, what=f"the view's first {ROWS} rows to be written", watch=(replica,))
        spark.sql(f"UPDATE delta.`{src}` SET payload = 'changed' WHERE id % 1000 = 0")
        wait_for(lambda: DeltaTable(tgt).transaction_version("mvsink:big") == 2, timeout=300,
                 what="the update to be written", watch=(replica,))
    finally:
        replica.kill(signal.SIGTERM)
    assert "maxResultSize" not in replica.logs()
    rows = spark.read.format("delta").load(tgt)
    assert rows.count() == ROWS
    assert rows.where("payload = 'changed'").count() == ROWS // 1000
