"""Bad rows become error updates that retract once fixed; bad configuration stops before writing."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql import types as T

from helpers import JOB, ROOT, create_source, insert, write_config
from mvsink import (ChangesInput, ConfigError, MaterializedView, TimeWentBackwards, ViewDefinition,
                    ViewInError, load_config, read_view, view_errors)
from mvsink.desired import key_check
from mvsink.desired.change_feed import change_feed
from mvsink.desired.row_errors import NullKeyErrors
from mvsink.target.create import create_target
from mvsink.updates import ERROR, table_schema


def parse_amount(row: dict) -> dict | None:
    """A user function: filter, cast, map. int() fails on bad input."""
    if row["v"] == "skip":
        return None
    return {"id": row["id"], "amount": int(row["v"]), "label": f"#{row['id']}"}


def _errors(spark, tgt, t):
    return sorted(r[0] for r in view_errors(spark, tgt, t).collect())


@pytest.mark.parametrize("touched_keys_join", ["broadcast", "sort-merge"])
def test_bad_rows_become_error_updates_and_retract_when_fixed(spark, tmp_path, monkeypatch, touched_keys_join):
    if touched_keys_join == "sort-merge":  # as for more touched keys than a broadcast takes
        monkeypatch.setattr(key_check, "BROADCAST_KEYS", -1)
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "10"), (2, "20"), (3, "skip")])
    view = ViewDefinition(
        "amounts", tgt,
        ChangesInput(src, map_row=parse_amount, output_schema="id BIGINT, amount INT, label STRING"),
        key=("id",), replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    assert {tuple(r) for r in read_view(spark, tgt, "amounts").collect()} == {(1, 10, "#1"), (2, 20, "#2")}

    for row in [(4, "x4"),                                # a failed cast in the user function
                (None, "5"),                              # a null key
                (1, "11"),                                # key 1 now has two different rows
                (6, "99999999999")]:                      # does not fit INT: a failed conversion
        insert(spark, src, [row])
        report = mv.run_until_caught_up()                 # one time each
    t = report.upper - 1
    errors = _errors(spark, tgt, t)
    assert len(errors) == 4, errors
    assert any(e.startswith("ValueError: invalid literal for int()") and '"v": "x4"' in e for e in errors)
    assert any(e.startswith("null in key column(s) ['id']") for e in errors)
    assert 'duplicate key {"id":1}: 2 rows' in errors
    assert any("99999999999" in e for e in errors)
    with pytest.raises(ViewInError, match="in error at time"):
        read_view(spark, tgt, "amounts")
    # Key 1's two rows are withheld while it has two (before: both in the view's rows).
    ok_rows = {tuple(r) for r in read_view(spark, tgt, "amounts", errors="ignore").collect()}
    assert ok_rows == {(2, 20, "#2")}
    assert {tuple(r) for r in spark.read.format("delta").load(tgt).collect()} == ok_rows
    # Each error appeared at the time of the commit that caused it, not before.
    assert len(_errors(spark, tgt, t - 1)) == 3 and len(_errors(spark, tgt, t - 3)) == 1

    spark.sql(f"UPDATE delta.`{src}` SET v = '4' WHERE id = 4")
    spark.sql(f"DELETE FROM delta.`{src}` WHERE id IS NULL OR v = '11' OR id = 6")
    report = mv.run_until_caught_up()
    assert _errors(spark, tgt, report.upper - 1) == []
    assert {tuple(r) for r in read_view(spark, tgt, "amounts").collect()} == {
        (1, 10, "#1"), (2, 20, "#2"), (4, 4, "#4")}


def test_missing_source_stops_with_a_clear_error_and_writes_nothing(spark, tmp_path):
    tgt = tmp_path / "tgt"
    with pytest.raises(ConfigError, match="is not a Delta table"):
        MaterializedView(spark, ViewDefinition("v", str(tgt), ChangesInput(str(tmp_path / "nope"))))
    assert not tgt.exists()


def test_source_without_change_feed_is_refused(spark, tmp_path):
    src = str(tmp_path / "src")
    spark.sql(f"CREATE TABLE delta.`{src}` (id BIGINT) USING delta")
    with pytest.raises(ConfigError, match="change data feed"):
        MaterializedView(spark, ViewDefinition("v", str(tmp_path / "tgt"), ChangesInput(src)))


def test_target_with_another_schema_is_refused_and_left_alone(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    other = ViewDefinition("v", tgt, ChangesInput(src))
    create_target(other, table_schema(T.StructType([T.StructField("id", T.IntegerType()),
                                                      T.StructField("w", T.StringType())])))
    version = DeltaTable(tgt).version()
    with pytest.raises(ConfigError, match=r"missing column v string; unexpected column w string; column id is int, the view has bigint"):
        MaterializedView(spark, ViewDefinition("v", tgt, ChangesInput(src)))
    assert DeltaTable(tgt).version() == version


def test_times_going_backwards_stop_the_view(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    insert(spark, src, [(2, "b")])
    insert(spark, src, [(3, "c")])
    view = ViewDefinition("v", tgt, ChangesInput(src), replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()                            # time 0 = source version 3
    shutil.rmtree(src)
    create_source(spark, src, [(9, "z")])               # recreated: versions start over
    version = DeltaTable(tgt).version()
    with pytest.raises(TimeWentBackwards, match=r"time 0 stands for version 3 of source src .*which is now at 1"):
        mv.step()
    with pytest.raises(TimeWentBackwards, match="which is now at 1; was a source recreated or restored"):
        MaterializedView(spark, view)
    shutil.rmtree(view.timeline)                        # a timeline lost: the target is past it
    with pytest.raises(TimeWentBackwards, match="the target's upper 1 is past the upper 0 of its timeline"):
        MaterializedView(spark, view)
    assert DeltaTable(tgt).version() == version


@pytest.mark.parametrize("settings, message", [
    ({"view_id": "v", "target": "t"}, "missing required setting 'input'"),
    ({"view_id": "v", "target": "t", "input": {"kind": "changes", "source": "s"}, "colour": 1},
     "unknown settings"),
    ({"view_id": "v", "target": "t", "input": {"kind": "stream", "source": "s"}}, "kind"),
    ({"view_id": "v", "target": "t", "input": {"kind": "snapshot", "source": "s", "query": "nomodule:f"}},
     "cannot import module 'nomodule'"),
    ({"view_id": "a/b", "target": "t", "input": {"kind": "changes", "source": "s"}}, "view_id"),
    ({"view_id": "v", "target": "t", "input": {"kind": "changes", "source": "s"}, "deletion_vectors": "maybe"},
     r"deletion_vectors must be one of \['auto', 'on', 'off'\], not 'maybe'"),
])
def test_bad_config_files_are_refused_with_the_reason(tmp_path, settings, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write_config(tmp_path / "view.yaml", **settings))


def test_the_job_exits_2_on_bad_configuration_without_writing(tmp_path):
    config = write_config(tmp_path / "view.yaml", view_id="v", target=str(tmp_path / "tgt"),
                          input={"kind": "changes", "source": str(tmp_path / "missing")})
    result = subprocess.run([sys.executable, str(JOB), "--config", str(config)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "bad configuration" in result.stderr and "is not a Delta table" in result.stderr
    assert not (tmp_path / "tgt").exists()


def test_a_not_null_key_is_not_checked_and_a_nullable_one_is(spark, tmp_path):
    """Delta refuses nulls in a NOT NULL column, and Spark knows it: its updates pass as they are
    (no null check in the plan); a nullable key's null still becomes an error update."""
    src = str(tmp_path / "src")
    spark.sql(f"CREATE TABLE delta.`{src}` (id BIGINT NOT NULL, v STRING) USING delta "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    insert(spark, src, [(1, "a")])
    with pytest.raises(Exception, match="NOT NULL|null"):
        insert(spark, src, [(None, "b")])
    feed = change_feed(spark, src, [(1, 1, 1)], 1, 1).withColumn(ERROR, F.lit(None).cast("string"))
    assert NullKeyErrors(("id",))(feed) is feed
    nullable = spark.createDataFrame([(None, "b", None, 1, 1)], "id BIGINT, v STRING, _mv_error STRING, "
                                                               "_mv_time BIGINT, _mv_diff BIGINT")
    (row,) = NullKeyErrors(("id",))(nullable).collect()
    assert row.id is None and row._mv_error.startswith("null in key column(s) ['id']")


@pytest.mark.parametrize("layout", ["table", "updates"])
def test_a_violated_key_is_never_two_rows_for_a_plain_reader(spark, tmp_path, caplog, layout):
    """While a key has two rows, readers of the view's rows (Spark, DuckDB, delta-rs on the
    table; plain_sql on the update layout) see neither, mvsink's status and view_errors show the
    error, and a WARNING names the view, the key and the time; an update in place of a withheld
    row stays withheld; when the key has one row again it is back, exactly."""
    import logging

    from helpers import duckdb_with_delta
    from mvsink.target.read import plain_sql
    from mvsink.target.status import table_status

    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b")])
    mv = MaterializedView(spark, ViewDefinition("keyed", tgt, ChangesInput(src), key=("id",), replica_id="r1",
                                                layout=layout))
    mv.run_until_caught_up()

    def plainly() -> list[set]:
        if layout == "updates":
            return [{tuple(r) for r in spark.sql(plain_sql(tgt, dialect="spark")).collect()}]
        duck = duckdb_with_delta()
        return [{tuple(r) for r in spark.read.format("delta").load(tgt).collect()},
                {tuple(r) for r in duck.execute(f"SELECT * FROM delta_scan('{tgt}')").fetchall()},
                set(zip(*DeltaTable(tgt).to_pyarrow_table().select(["id", "v"]).to_pydict().values()))]

    assert plainly()[0] == {(1, "a"), (2, "b")}
    with caplog.at_level(logging.WARNING, logger="mvsink.sink"):
        insert(spark, src, [(1, "c")])
        report = mv.run_until_caught_up()
    t = report.upper - 1
    assert all(rows == {(2, "b")} for rows in plainly()), plainly()
    assert _errors(spark, tgt, t) == ['duplicate key {"id":1}: 2 rows']
    if layout == "table":
        status = table_status(tgt, "keyed")
        assert status["errors"] == 1 and status["error_messages"] == ['duplicate key {"id":1}: 2 rows'], status
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "withheld" in r.getMessage()]
    assert any(m.startswith('view keyed: duplicate key {"id":1}: 2 rows at time ') and f"time {t}:" in m
               for m in warned), warned

    spark.sql(f"UPDATE delta.`{src}` SET v = 'a2' WHERE v = 'a'")  # in place: no key's count changes
    mv.run_until_caught_up()
    assert all(rows == {(2, "b")} for rows in plainly()), plainly()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mvsink.sink"):
        spark.sql(f"DELETE FROM delta.`{src}` WHERE v = 'c'")
        report = mv.run_until_caught_up()
    assert all(rows == {(1, "a2"), (2, "b")} for rows in plainly()), plainly()
    assert _errors(spark, tgt, report.upper - 1) == []
    assert {tuple(r) for r in read_view(spark, tgt, "keyed").collect()} == {(1, "a2"), (2, "b")}
    assert any('duplicate key {"id":1} ended at time' in r.getMessage() for r in caplog.records)
    # The time of the violation still reads as it was (no rows of key 1, the error).
    assert _errors(spark, tgt, t) == ['duplicate key {"id":1}: 2 rows']
