"""Pipelines: SQL files and Python functions of views over sources and views, one timeline, one
Spark session.

Bad input is refused at load, each with its own clear error naming the file and line, nothing
written; a pipeline of six views, two levels of views over views, run in one session over
TPC-H-like tables changed at random, is at every committed version and time equal to DuckDB's
computation from the sources at that time's versions, and its views read at one time agree; so is
one with Python views over SQL views and SQL views over Python views, in this session and as a
job process; a Python view's definition id follows its function's code and that of the views it
reads."""

from __future__ import annotations

import random
import signal
from collections import Counter

import pytest

from pyspark.sql import types as T

from pipeline_tpch import (MIXED_VIEWS, NEW_KEYS, PYTHON, TABLES, VIEWS, Independent, random_commit, view_rows_at, views_agree,
                           write_pipeline)
from helpers import Replica, create_source, wait_for
from mvsink import MaterializedView
from mvsink.check import caught_up, check_table
from mvsink.definition import definition_id
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
PY = "from mvsink.pipeline import materialized_view\n\n"

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
    "a trigger of 0": ({"a.sql": GOOD, "pipeline.yaml": "defaults: {trigger_seconds: 0}"},
                       "defaults.trigger_seconds must be a positive number of seconds, not 0"),
    "python: unknown source or view": ({"p.py": PY + "@materialized_view()\ndef v(orders, nope):\n    return orders\n"},
                                       "p.py:3: view v takes parameter nope, which is neither a source "
                                       "(customer, orders) nor a view of the pipeline (v)"),
    "python: the name of a SQL view": ({"a.sql": GOOD, "p.py": PY + "\n@materialized_view(name='big')\n"
                                        "def b(orders):\n    return orders\n"},
                                       "p.py:4: view big is defined twice; first at %s/a.sql:1"),
    "python: no DataFrame": ({"p.py": PY + "@materialized_view()\ndef v(orders):\n    return orders.count()\n"},
                             "p.py:3: view v: its function returned int, not a DataFrame"),
    "python: does not import": ({"p.py": PY + "import no_such_module_27\n"},
                                "p.py:3: cannot import it: ModuleNotFoundError: No module named 'no_such_module_27'"),
    "python: syntax error": ({"p.py": PY + "def v(orders:\n    return orders\n"},
                             "p.py:3: cannot import it: SyntaxError"),
    "python: function fails": ({"p.py": PY + "@materialized_view()\ndef v(orders):\n    x = 1\n"
                                         "    return orders.select('nope')\n"},
                               "p.py:6: view v: its function fails over the sources' current rows: AnalysisException"),
    "python: key not produced": ({"p.py": PY + "@materialized_view(key=('total',))\n"
                                           "def v(orders):\n    return orders\n"},
                                 "p.py:3: view v: KEY column(s) total not produced by its function"),
    "python: **kwargs": ({"p.py": PY + "@materialized_view()\ndef v(**tables):\n    return tables['orders']\n"},
                         "p.py:3: view v: parameter **tables cannot name a source or view"),
    "python: a cycle with SQL": ({"a.sql": "CREATE MATERIALIZED VIEW a AS SELECT * FROM p",
                                  "p.py": PY + "@materialized_view()\ndef p(a):\n    return a\n"},
                                 "dependency cycle: a (%s/a.sql:1) -> p (%s/p.py:3) -> a (%s/a.sql:1)"),
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


def _run(spark, sources, views, rng, commits: int, tpch: bool = False) -> None:
    """``commits`` random source commits (new keys above the TPC-H tables' with ``tpch``), the
    views stepped in random order after every other one."""
    next_key = [10_000_000 if tpch else 100]
    for n in range(commits):
        random_commit(spark, sources, rng, n, next_key, NEW_KEYS["tpch" if tpch else "few"])
        if n % 2:                            # two source commits on one time, sometimes
            continue
        for view in rng.sample(views, len(views)):   # any order: no view waits for another
            view.step()
    for view in views:
        view.run_until_caught_up()


def test_a_pipeline_in_one_session_is_exact_at_every_time_and_consistent(spark, tmp_path, capsys):
    """Over TPC-H's tables as ``tpchgen-cli`` generates them (scale 0.01: 60,175 lineitems)."""
    rng = random.Random(27)
    sources = write_pipeline(spark, tmp_path, tpch_scale=0.01)
    pipeline = load_pipeline(spark, tmp_path)
    assert pipeline.graph.order.index("nation_revenue") > pipeline.graph.order.index("customer_revenue")
    assert {v: pipeline.graph.level(v) for v in VIEWS} == {
        "order_lines": 0, "customer_nation": 0, "open_orders": 0,
        "customer_revenue": 1, "returns_by_flag": 1, "nation_revenue": 2}
    views = [MaterializedView(spark, view_from_spec(spec, read_only=False, replica_id="r1"))
             for spec in pipeline.view_specs()]
    assert spark.read.format("delta").load(sources["lineitem"]).count() == 60_175
    _run(spark, sources, views, rng, 6, tpch=True)

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
    # Each view's strategy, as `mvsink explain view.yaml` says it, under the view.
    assert "    reads customer, nation\n    its query is an inner join:" in explained
    assert ("    reads customer_nation, order_lines\n    its query is a linear aggregate: its changes are its groups' "
            "changes from each source's changes joined with the other sources;") in explained
    assert "    reads orders\n    its query is row-wise:" in explained
    assert ("    reads customer_revenue\n    its query is a linear aggregate of a linear aggregate (a rollup): the one "
            "below moves its groups by each source's changes joined with the other sources") in explained
    assert cli.main(["status", "--pipeline", str(tmp_path)]) == 0
    status = capsys.readouterr().out
    assert all(f"view {view} in {targets[view]} (table layout" in status for view in VIEWS), status


def test_python_views_over_sql_views_and_sql_views_over_python_views_are_exact_and_consistent(spark, tmp_path, capsys):
    rng = random.Random(2727)
    sources = write_pipeline(spark, tmp_path, python=True)
    pipeline = load_pipeline(spark, tmp_path)
    levels = {v: pipeline.graph.level(v) for v in ("big_customers", "big_by_nation", "big_share")}
    assert levels == {"big_customers": 2, "big_by_nation": 3, "big_share": 4}
    assert pipeline.graph.reads["big_share"] == ["big_by_nation", "customer_nation"]
    specs = {spec["view_id"]: spec for spec in pipeline.view_specs()}
    assert specs["big_share"]["key"] == ["n_name"]
    assert specs["big_by_nation"]["input"]["sql"].strip().startswith("SELECT n_name, count(*)")
    upstream = [v["name"] for v in specs["big_by_nation"]["input"]["views"]]  # in dependency order
    assert sorted(upstream[:2]) == ["customer_nation", "order_lines"]
    assert upstream[2:] == ["customer_revenue", "big_customers"]
    assert "views" not in specs["nation_revenue"]["input"]   # all SQL: one query, as before
    views = [MaterializedView(spark, view_from_spec(spec, read_only=False, replica_id="r1")) for spec in specs.values()]
    _run(spark, sources, views, rng, 4)

    independent = Independent(tmp_path, sources, pipeline.config.timeline, MIXED_VIEWS)
    targets = pipeline.config.targets
    for view, columns in MIXED_VIEWS.items():
        result = check_table(targets[view], view, columns, independent.expected(view))
        assert result.ok, (view, result.problems[:3])
        assert result.times_checked >= 3, view
    nonempty = 0
    for t in range(min(v.frontier() for v in views)):
        views_agree(targets, t)
        big = view_rows_at(targets["big_customers"], "big_customers", t)
        by_nation = Counter()
        for _, nation, revenue, _ in big.elements():
            by_nation[nation] += revenue
        rows = view_rows_at(targets["big_by_nation"], "big_by_nation", t)
        assert {(n, r) for n, _, r in rows} == set(by_nation.items()), t
        assert {(n, c) for n, c, _ in view_rows_at(targets["big_share"], "big_share", t)} == \
            {(n, c) for n, c, _ in rows}, t
        nonempty += bool(big)
    assert nonempty >= 2, "the Python view held rows at two times at least"

    assert cli.main(["explain", "--pipeline", str(tmp_path)]) == 0
    explained = capsys.readouterr().out
    assert f"view big_share ({tmp_path}/py/big.py:13): level 4, key (n_name)" in explained
    assert "view_big_customers --> view_big_by_nation" in explained


def test_a_job_process_runs_python_views_found_again_by_their_files(spark, tmp_path):
    """``mvsink_job.py --pipeline`` loads the Python files itself and runs each Python view from its
    spec (``path.py:function``): every view exact at every time after two source commits."""
    rng = random.Random(2728)
    sources = write_pipeline(spark, tmp_path, python=True)
    (tmp_path / "logs").mkdir()
    config = load_pipeline(spark, tmp_path).config
    replica = Replica(None, "job", tmp_path / "logs", "--pipeline", str(tmp_path)).start()

    def all_caught_up() -> bool:
        return all(caught_up(config.targets[v], v, config.timeline) for v in MIXED_VIEWS)

    try:
        wait_for(all_caught_up, timeout=600, what="every view's first commit", watch=(replica,))
        next_key = [100]
        for n in range(2):
            random_commit(spark, sources, rng, n, next_key)
        wait_for(all_caught_up, timeout=600, what="every view to catch up", watch=(replica,))
    finally:
        replica.kill(signal.SIGTERM)
    independent = Independent(tmp_path, sources, config.timeline, MIXED_VIEWS)
    for view, columns in MIXED_VIEWS.items():
        result = check_table(config.targets[view], view, columns, independent.expected(view))
        assert result.ok, (view, result.problems[:3])
        assert result.times_checked >= 2, view


def test_a_python_view_s_definition_follows_its_code_and_the_views_it_reads(spark, tmp_path):
    write_pipeline(spark, tmp_path, python=True)

    def ids() -> dict[str, str]:
        return {spec["view_id"]: definition_id(view_from_spec(spec, read_only=True), T.StructType())
                for spec in load_pipeline(spark, tmp_path).view_specs()}

    before = ids()
    assert ids() == before, "one pipeline, one id per view"
    (tmp_path / "py" / "big.py").write_text(PYTHON.replace(">= 150", ">= 400"))
    changed = ids()
    assert {v for v in before if changed[v] != before[v]} == {"big_customers", "big_by_nation", "big_share"}
    (tmp_path / "py" / "big.py").write_text(PYTHON.replace('"all_customers"))', '"all_customers"))  # all'))
    changed = ids()
    assert {v for v in before if changed[v] != before[v]} == {"big_share"}


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
