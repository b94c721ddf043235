"""Readers that know nothing of mvsink (DuckDB's delta_scan, plain Spark SQL) see the view's rows
with the SQL :func:`mvsink.read.plain_sql` prints: at the latest time and at every retained time,
equal to an independent computation from the source, after every committed version."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import duckdb
import pytest

from helpers import create_source, insert
from mvsink import ChangesInput, MaterializedView, ViewDefinition
from mvsink.check import expected_from_source
from mvsink.read import plain_sql, view_since, view_upper


def _duckdb():
    """DuckDB with the delta extension of the duckdb-ext-delta package (no download)."""
    import duckdb_ext

    extensions = Path(list(duckdb_ext.__path__)[0]) / "extensions"
    con = duckdb.connect(config={"extension_directory": str(extensions), "autoinstall_known_extensions": False})
    con.execute("LOAD delta")
    return con


def test_duckdb_and_plain_spark_sql_read_the_view_at_every_version_and_time(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, f"v{i}") for i in range(6)])
    view = ViewDefinition("plain", tgt, ChangesInput(src), key=("id",), replica_id="r1")
    mv = MaterializedView(spark, view)
    expected = expected_from_source(src, ["id", "v"], timeline=view.timeline)
    con = _duckdb()
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
    MaterializedView(spark, ViewDefinition("p", tgt, ChangesInput(src), replica_id="r1")).run_until_caught_up()
    with pytest.raises(ValueError, match="dialect must be one of"):
        plain_sql(tgt, dialect="oracle")
    with pytest.raises(ValueError, match="needs table"):
        plain_sql(tgt, dialect="trino")
    assert "CROSS JOIN UNNEST(sequence(1, v._mv_n))" in plain_sql(tgt, dialect="trino", table="delta.views.p")
