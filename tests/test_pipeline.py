"""Pipelines: SQL files of views over sources and views, one timeline, one Spark session.

Bad input is refused at load, each with its own clear error naming the file and line, nothing
written; a pipeline of six views, two levels of views over views, run in one session over
TPC-H-like tables changed at random, is at every committed version and time equal to DuckDB's
computation from the sources at that time's versions, and its views read at one time agree."""

from __future__ import annotations

import random

import pytest

from pipeline_tpch import TABLES, VIEWS, Independent, random_commit, views_agree, write_pipeline
from helpers import create_source
from mvsink import MaterializedView
from mvsink.check import check_table
from mvsink.pipeline import PipelineError, load_pipeline
from mvsink.pipeline.parse import parse_file
from mvsink.replica import cli
from mvsink.view import view_from_spec


@pytest.fixture(scope="module")
def shop(spark, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("shop")
    sources = {name: str(root / name) for name in ("orders", "customer")}
    create_source(spark, sources["orders"], [(1, 10, "O", 5)], TABLES["orders"])
    create_source(spark, sources["customer"], [(10, "ann", 0)], TABLES["customer"])
    return sources


GOOD = "CREATE MATERIALIZED VIEW big KEY (o_orderkey) AS SELECT o_orderkey, o_totalprice FROM orders;\n"

BAD = {
    "header": ({"a.sql": "-- one\n\nCREATE VIEW v AS SELECT 1"}, "a.sql:3: expected MATERIALIZED, found 'VIEW'"),
    "key list": ({"a.sql": "\nCREATE MATERIALIZED VIEW v KEY (a b) AS SELECT 1"}, "a.sql:2: expected , or )"),
    "no query": ({"a.sql": "CREATE MATERIALIZED VIEW v AS ;"}, "a.sql:1: view v: no query after AS"),
    "query does not parse": ({"a.sql": GOOD + "\nCREATE MATERIALIZED VIEW v AS\nSELECT o_orderkey\nFROM orders WHERE ("},
                             "a.sql:5: view v: its query does not parse"),
    "unknown table": ({"a.sql": GOOD + "CREATE MATERIALIZED VIEW v AS\nSELECT * FROM big JOIN nope ON true"},
                      "a.sql:2: view v reads nope, which is neither a source (customer, orders) nor a view "
                      "of the pipeline (big, v)"),
    "a path is no source": ({"a.sql": "CREATE MATERIALIZED VIEW v AS SELECT * FROM delta.`/tmp/x`"},
                            "a.sql:1: view v reads delta./tmp/x, which is neither"),
    "cycle": ({"a.sql": "CREATE MATERIALIZED VIEW a AS SELECT * FROM b;\n\nCREATE MATERIALIZED VIEW b AS "
                        "SELECT * FROM orders WHERE o_orderkey IN (SELECT o_orderkey FROM a)"},
              "dependency cycle: a (%s/a.sql:1) -> b (%s/a.sql:3) -> a (%s/a.sql:1)"),
    "defined twice": ({"a.sql": GOOD, "b.sql": "\n" + GOOD}, "b.sql:2: view big is defined twice; first at %s/a.sql:1"),
    "named like a source": ({"a.sql": "CREATE MATERIALIZED VIEW Orders AS SELECT 1 AS x"},
                            "a.sql:1: view Orders has the name of source orders"),
    "one target": ({"a.sql": GOOD + "CREATE MATERIALIZED VIEW small AS SELECT * FROM big",
                    "pipeline.yaml": "views: {small: {target: views/big}}"},
                   "a.sql:2: views big (%s/a.sql:1) and small have one target"),
    "key not produced": ({"a.sql": "CREATE MATERIALIZED VIEW v KEY (o_orderkey, total) AS\n"
                                   "SELECT o_orderkey, o_totalprice FROM orders"},
                         "a.sql:1: view v: KEY column(s) total not produced by its query "
                         "(its columns: o_orderkey, o_totalprice)"),
    "query does not analyze": ({"a.sql": GOOD + "CREATE MATERIALIZED VIEW v AS\nSELECT o_orderkey,\n  nope\nFROM big"},
                               "a.sql:4: view v: its query cannot be analyzed: [UNRESOLVED_COLUMN"),
    "unknown setting": ({"a.sql": GOOD, "pipeline.yaml": "target: x"}, "pipeline.yaml: unknown settings ['target']"),
    "unknown view setting": ({"a.sql": GOOD, "pipeline.yaml": "views: {other: {layout: table}}"},
                             "views.other: no view 'other' is defined"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_with_its_file_and_line_and_nothing_written(spark, shop, tmp_path, case):
    files, message = BAD[case]
    config = f"sources: {{orders: {shop['orders']}, customer: {shop['customer']}}}\ntargets: views\n"
    for name, text in {"pipeline.yaml": "", **files}.items():
        (tmp_path / name).write_text(config + text if name == "pipeline.yaml" else text)
    with pytest.raises(PipelineError) as refused:
        load_pipeline(spark, tmp_path)
    assert (message.replace("%s", str(tmp_path)) if "%s" in message else message) in str(refused.value)
    assert not (tmp_path / "views").exists()


def test_a_pipeline_in_one_session_is_exact_at_every_time_and_consistent(spark, tmp_path, capsys):
    rng = random.Random(27)
    sources = write_pipeline(spark, tmp_path)
    pipeline = load_pipeline(spark, tmp_path)
    assert pipeline.graph.order.index("nation_revenue") > pipeline.graph.order.index("customer_revenue")
    assert {v: pipeline.graph.level(v) for v in VIEWS} == {
        "order_lines": 0, "customer_nation": 0, "open_orders": 0,
        "customer_revenue": 1, "returns_by_flag": 1, "nation_revenue": 2}
    views = [MaterializedView(spark, view_from_spec(spec, read_only=False, replica_id="r1"))
             for spec in pipeline.view_specs()]
    next_key = [100]
    for n in range(6):
        random_commit(spark, sources, rng, n, next_key)
        if n % 2:                            # two source commits on one time, sometimes
            continue
        for view in rng.sample(views, len(views)):   # any order: no view waits for another
            view.step()
    for view in views:
        view.run_until_caught_up()

    independent = Independent(tmp_path, sources, pipeline.config.timeline)
    targets = pipeline.config.targets
    for view in VIEWS:
        result = check_table(targets[view], view, VIEWS[view], independent.expected(view))
        assert result.ok, (view, result.problems[:3])
        assert result.times_checked >= 4, view
    upper = min(v.frontier() for v in views)
    for t in range(upper):
        views_agree(targets, t)

    assert cli.main(["explain", "--pipeline", str(tmp_path)]) == 0
    explained = capsys.readouterr().out
    assert f"view nation_revenue ({tmp_path}/sql/gold.sql:11): level 2, key (n_name)" in explained
    assert "    reads customer_revenue\n" in explained and "view_customer_revenue --> view_nation_revenue" in explained
    assert cli.main(["status", "--pipeline", str(tmp_path)]) == 0
    status = capsys.readouterr().out
    assert all(f"view {view} in {targets[view]} (table layout" in status for view in VIEWS), status


def test_statements_split_at_semicolons_outside_strings_comments_and_quoted_names(tmp_path):
    path = tmp_path / "v.sql"
    path.write_text("/* a; /* nested; */ still; */\n-- ; \n"
                    "CREATE MATERIALIZED VIEW `a` KEY (x, `y`) AS SELECT ';' AS x, \"\\\";\" AS `y;` FROM t;\n"
                    ";\n  create materialized view b as\n  select 1 -- end;")
    a, b = parse_file(path)
    assert (a.name, a.key, a.line, a.query_line, a.query_column) == ("a", ("x", "y"), 3, 3, 44)
    assert a.query == " SELECT ';' AS x, \"\\\";\" AS `y;` FROM t"
    assert (b.name, b.key, b.line, b.query) == ("b", (), 5, "\n  select 1 -- end;")
    assert b.located_query().splitlines()[5] == "  select 1 -- end;"
