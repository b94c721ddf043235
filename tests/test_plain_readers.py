"""Readers that know nothing of mvsink see the view's rows: in the table layout (the default) the
table itself, at its latest version (DuckDB's delta_scan, delta-rs, plain Spark) and, by time
travel, at the version that holds each time; in the update layout with the SQL
:func:`mvsink.target.read.plain_sql` prints. Each equal to an independent computation from the source,
after every committed version."""

from __future__ import annotations

from collections import Counter

import pytest

from deltalake import DeltaTable

from helpers import create_source, duckdb_with_delta, insert, read_plainly_at_every_time, rows_of_unique_keys
from mvsink import ChangesInput, MaterializedView, ViewDefinition
from mvsink.check import expected_from_source
from mvsink.target.read import plain_sql, version_of_time, view_since, view_upper


def test_any_delta_reader_reads_the_table_as_the_view_at_every_version(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, f"v{i}") for i in range(6)])
    view = ViewDefinition("plain", tgt, ChangesInput(src), key=("id",), replica_id="r1")
    mv = MaterializedView(spark, view)
    from_source = expected_from_source(src, ["id", "v"], timeline=view.timeline)

    def expected(t: int) -> Counter:  # the rows of a violated key (11 while it repeats) withheld
        return Counter(rows_of_unique_keys(list(from_source(t).elements()), [0]))

    con = duckdb_with_delta()
    edits = [
        lambda: insert(spark, src, [(10, "x"), (11, None), (11, None)]),
        lambda: spark.sql(f"UPDATE delta.`{src}` SET v = concat(v, '!') WHERE id % 2 = 0"),
        lambda: spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 3 OR id = 11"),
        lambda: insert(spark, tgt, [(99, "garbage"), (1, "v1")]),  # a foreign write, repaired
        lambda: spark.sql(f"DELETE FROM delta.`{tgt}` WHERE id < 3"),  # foreign again
        lambda: insert(spark, src, [(3, "back")]),
    ]
    for edit in [lambda: None] + edits:
        edit()
        mv.run_until_caught_up()
        now = expected(view_upper(tgt, "plain") - 1)
        assert Counter(con.sql(f"SELECT * FROM delta_scan('{tgt}')").fetchall()) == now
        latest = DeltaTable(tgt).to_pyarrow_table()
        assert latest.column_names == ["id", "v"], "the view's columns only"
        assert Counter(zip(latest.column("id").to_pylist(), latest.column("v").to_pylist())) == now
        assert Counter(tuple(r) for r in spark.sql(f"SELECT * FROM delta.`{tgt}`").collect()) == now
        assert Counter(con.sql(plain_sql(tgt)).fetchall()) == now, "plain_sql is a plain SELECT"
    times, versions = read_plainly_at_every_time(spark, tgt, "plain", ["id", "v"], expected)
    assert times == view_upper(tgt, "plain"), "every time, the repair times of the foreign writes included"
    assert versions >= len(edits)
    with pytest.raises(ValueError, match="time travel"):
        plain_sql(tgt, time=1)
    assert version_of_time(tgt, "plain", 0) == 1


def test_duckdb_and_plain_spark_sql_read_the_update_layout_at_every_version_and_time(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, f"v{i}") for i in range(6)])
    view = ViewDefinition("plain", tgt, ChangesInput(src), key=("id",), replica_id="r1", layout="updates")
    mv = MaterializedView(spark, view)
    expected = expected_from_source(src, ["id", "v"], timeline=view.timeline)
    con = duckdb_with_delta()
    edits = [
        lambda: insert(spark, src, [(10, "x"), (11, None)]),
        lambda: spark.sql(f"UPDATE delta.`{src}` SET v = concat(v, '!') WHERE id % 2 = 0"),
        lambda: spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 3"),
        lambda: insert(spark, tgt, [(99, "garbage", None, 0, 1)]),  # a foreign write, repaired
        lambda: insert(spark, src, [(3, "back")]),
    ]
    checked = 0
    for edit in [lambda: None] + edits:
        edit()
        mv.run_until_caught_up()
        upper, since = view_upper(tgt, "plain"), view_since(tgt, "plain")
        assert Counter(con.sql(plain_sql(tgt)).fetchall()) == expected(upper - 1)
        assert Counter(tuple(r) for r in spark.sql(plain_sql(tgt, dialect="spark")).collect()) == expected(upper - 1)
        for t in range(since, upper):
            assert Counter(con.sql(plain_sql(tgt, time=t)).fetchall()) == expected(t), f"time {t}"
            checked += 1
    assert checked >= 6


def test_plain_sql_refuses_an_unknown_dialect_and_trino_without_a_table(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    MaterializedView(spark, ViewDefinition("p", tgt, ChangesInput(src), replica_id="r1",
                                           layout="updates")).run_until_caught_up()
    with pytest.raises(ValueError, match="dialect must be one of"):
        plain_sql(tgt, dialect="oracle")
    with pytest.raises(ValueError, match="needs table"):
        plain_sql(tgt, dialect="trino")
    assert "CROSS JOIN UNNEST(sequence(1, v._mv_n))" in plain_sql(tgt, dialect="trino", table="delta.views.p")
