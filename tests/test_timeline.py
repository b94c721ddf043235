"""Views over several sources on one timeline, in one process: joins in SQL and in Python, every
time equal to the sources at that time's versions, two views consistent at one time, catch-up
that evaluates once per time, and bad input refused before anything is written."""

from __future__ import annotations

import shutil
import time
from collections import Counter

import pytest
from deltalake import DeltaTable

from helpers import create_source, insert, write_config
from mvsink import ConfigError, MaterializedView, SnapshotInput, ViewDefinition, load_config, read_view
from mvsink.check import TimelineReader, check_table
from mvsink.timeline import Timeline, TimelineError
from timeline_views import (CUSTOMERS, LINEITEM, ORDERS, ORDERS_WITH_CUSTOMERS_COLUMNS,
                            ORDERS_WITH_CUSTOMERS_SQL, REVENUE_COLUMNS, Independent, revenue_per_customer)


def _shop(spark, tmp_path) -> dict[str, str]:
    sources = {name: str(tmp_path / name) for name in ("orders", "customers", "lineitem")}
    create_source(spark, sources["customers"], [(1, "ann", "NL"), (2, "bob", "FR"), (3, "cy", "NL")], CUSTOMERS)
    create_source(spark, sources["orders"], [(10, 1, 100), (11, 2, 50), (12, 1, 75)], ORDERS)
    create_source(spark, sources["lineitem"], [(10, 1, 60), (10, 2, 40), (11, 1, 50), (12, 1, 75)], LINEITEM)
    return sources


def _views(tmp_path, sources, **extra):
    timeline = str(tmp_path / "shop_timeline")
    joined = ViewDefinition("orders_with_customers", str(tmp_path / "owc"),
                            SnapshotInput(sql=ORDERS_WITH_CUSTOMERS_SQL), key=("id",), sources=sources,
                            timeline=timeline, **extra)
    revenue = ViewDefinition("revenue", str(tmp_path / "revenue"), SnapshotInput(query=revenue_per_customer),
                             key=("customer",), sources=sources, timeline=timeline, **extra)
    return joined, revenue


def test_join_views_on_one_timeline_equal_the_sources_at_every_time(spark, tmp_path):
    sources = _shop(spark, tmp_path)
    joined_def, revenue_def = _views(tmp_path, sources, replica_id="r1")
    joined, revenue = MaterializedView(spark, joined_def), MaterializedView(spark, revenue_def)
    both = (joined, revenue)
    for mv in both:
        mv.run_until_caught_up()
    edits = [
        lambda: insert(spark, sources["orders"], [(13, 3, 20)]),
        lambda: insert(spark, sources["lineitem"], [(13, 1, 20), (11, 2, 5)]),
        lambda: spark.sql(f"UPDATE delta.`{sources['customers']}` SET nation = 'BE' WHERE id = 1"),
        lambda: spark.sql(f"DELETE FROM delta.`{sources['orders']}` WHERE id = 11"),
        lambda: insert(spark, sources["customers"], [(4, "dee", "DE")]),
        lambda: insert(spark, sources["orders"], [(14, 4, 30)]),
        lambda: insert(spark, sources["lineitem"], [(14, 1, 30)]),
    ]
    for i, edit in enumerate(edits):
        edit()
        if i % 3 != 1:                       # sometimes two source commits before one step
            for mv in both:
                mv.step()
    for mv in both:
        mv.run_until_caught_up()

    timeline = TimelineReader(joined_def.timeline)
    ours = Timeline(joined_def.timeline, None)
    upper = ours.refresh()
    # As of a wall clock: the latest time minted by then.
    assert ours.time_at(ours.entries[0].minted_at - 1) is None
    for entry in ours.entries:
        assert ours.time_at(entry.minted_at) >= entry.time
    assert ours.time_at(int(time.time() * 1000)) == upper - 1
    source_commits = len(edits)
    assert 1 + source_commits // 2 <= upper - 1 < source_commits, "some times cover several commits"
    versions = [timeline.versions(t) for t in range(upper)]
    assert versions[0] == {"orders": 1, "customers": 1, "lineitem": 1}
    assert versions[-1] == {name: DeltaTable(path).version() for name, path in sources.items()}

    independent = Independent(joined_def.timeline, sources)
    for view, columns, expected in ((joined_def, ORDERS_WITH_CUSTOMERS_COLUMNS, independent.orders_with_customers),
                                    (revenue_def, REVENUE_COLUMNS, independent.revenue)):
        result = check_table(view.target, view.view_id, columns, expected)
        assert result.ok, (view.view_id, result.problems)
        assert result.times_checked >= upper

    # One time, two views, the same source versions: the join and the aggregate agree.
    for t in range(upper):
        owc = Counter(tuple(r) for r in read_view(spark, joined_def.target, joined_def.view_id, t).collect())
        rev = Counter(tuple(r) for r in read_view(spark, revenue_def.target, revenue_def.view_id, t).collect())
        assert owc == independent.orders_with_customers(t) and rev == independent.revenue(t), t


EVALUATIONS: list[int] = []


def counted_identity(orders):
    EVALUATIONS.append(1)
    return orders


def test_catch_up_evaluates_the_query_once_per_time_not_per_source_commit(spark, tmp_path):
    src, tgt = str(tmp_path / "orders"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, 1, 10)], ORDERS)
    mv = MaterializedView(spark, ViewDefinition("ids", tgt, SnapshotInput(src, counted_identity), key=("id",),
                                                replica_id="r1"))
    mv.run_until_caught_up()
    EVALUATIONS.clear()
    for i in range(2, 12):                  # ten source commits while the replica is not looking
        insert(spark, src, [(i, 1, i)])
    report = mv.step()
    assert report.minted_time == 1 and report.appended
    # The query is row-wise: the one new time is it over the feed's inserted rows and over its
    # deleted rows, once each, however many source commits the time covers.
    assert mv.desired.row_wise and len(EVALUATIONS) == 2, "one evaluation per sign for the one new time"
    assert TimelineReader(tgt + "_timeline").version(1) == DeltaTable(src).version()
    EVALUATIONS.clear()
    mv.step()
    assert EVALUATIONS == [], "no new time, no evaluation"
    assert {r.id for r in read_view(spark, tgt, "ids").collect()} == set(range(1, 12))


def test_views_on_one_timeline_must_declare_its_sources(spark, tmp_path):
    sources = _shop(spark, tmp_path)
    joined_def, _ = _views(tmp_path, sources, replica_id="r1")
    MaterializedView(spark, joined_def).run_until_caught_up()
    fewer = {k: v for k, v in sources.items() if k != "lineitem"}
    other = ViewDefinition("other", str(tmp_path / "other"), SnapshotInput(sql="SELECT * FROM orders"),
                           sources=fewer, timeline=joined_def.timeline, replica_id="r1")
    with pytest.raises(TimelineError, match=r"timeline .* is for sources .*lineitem.* but the view declares"):
        MaterializedView(spark, other)
    assert not (tmp_path / "other").exists()
    plain = str(tmp_path / "plain")
    create_source(spark, plain, [(1, "a")])
    not_a_timeline = ViewDefinition("other", str(tmp_path / "other"), SnapshotInput(sql="SELECT * FROM orders"),
                                    sources=sources, timeline=plain, replica_id="r1")
    with pytest.raises(TimelineError, match="not an mvsink timeline"):
        MaterializedView(spark, not_a_timeline).step()
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("sql, message", [
    ("SELECT o.id FROM orders o JOIN suppliers s ON o.id = s.id", r"not one of its sources .*suppliers"),
    ("SELEC id FROM orders", "its SQL does not parse"),
    ("SELECT nope FROM orders", "cannot be analyzed"),
])
def test_bad_sql_is_refused_at_start_and_nothing_is_written(spark, tmp_path, sql, message):
    sources = _shop(spark, tmp_path)
    view = ViewDefinition("bad", str(tmp_path / "bad"), SnapshotInput(sql=sql), sources=sources, replica_id="r1")
    with pytest.raises(ConfigError, match=message):
        MaterializedView(spark, view)
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad_timeline").exists()


def test_a_source_that_is_missing_or_disappears_stops_the_view(spark, tmp_path):
    sources = _shop(spark, tmp_path)
    missing = {**sources, "customers": str(tmp_path / "nowhere")}
    with pytest.raises(ConfigError, match=r"source customers \(.*nowhere\) of view 'owc' is not a Delta table"):
        MaterializedView(spark, ViewDefinition("owc", str(tmp_path / "owc"),
                                               SnapshotInput(sql=ORDERS_WITH_CUSTOMERS_SQL), sources=missing))
    view = ViewDefinition("owc", str(tmp_path / "owc"), SnapshotInput(sql=ORDERS_WITH_CUSTOMERS_SQL),
                          sources=sources, replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    version = DeltaTable(view.target).version()
    shutil.rmtree(sources["customers"])
    with pytest.raises(ConfigError, match=r"source customers \(.*customers\) of view 'owc' has disappeared"):
        mv.step()
    assert DeltaTable(view.target).version() == version


def test_yaml_views_over_named_sources(tmp_path):
    config = write_config(tmp_path / "view.yaml", view_id="owc", target="owc", timeline="shop",
                          sources={"orders": "data/orders", "customers": "data/customers"},
                          key=["id"], input={"kind": "snapshot", "sql": ORDERS_WITH_CUSTOMERS_SQL})
    view = load_config(config)
    assert view.sources == {"orders": str(tmp_path / "data/orders"), "customers": str(tmp_path / "data/customers")}
    assert view.timeline == str(tmp_path / "shop") and view.input.sql == ORDERS_WITH_CUSTOMERS_SQL
    changes = write_config(tmp_path / "c.yaml", view_id="o", target="o", sources={"orders": "data/orders"},
                           input={"kind": "changes", "source": "orders"})
    assert load_config(changes).input.source == str(tmp_path / "data/orders")
    assert load_config(changes).timeline == str(tmp_path / "o_timeline"), "a timeline of its own by default"
    for settings, message in [
        ({"input": {"kind": "changes", "source": "customers"}, "sources": {"orders": "o"}},
         "neither a name nor a path of its sources"),
        ({"input": {"kind": "snapshot", "sql": "SELECT 1", "query": "m:f"}, "sources": {"orders": "o"}},
         "needs query: module:function, or sql: text"),
        ({"input": {"kind": "snapshot", "sql": "SELECT 1"}}, "needs sources"),
        ({"input": {"kind": "snapshot", "sql": "SELECT 1"}, "sources": {"not a name": "o"}},
         "not SQL identifiers"),
        ({"input": {"kind": "snapshot", "sql": "SELECT 1"}, "sources": ["o"]}, "sources must map names"),
    ]:
        bad = write_config(tmp_path / "bad.yaml", view_id="b", target="b", **settings)
        with pytest.raises(ConfigError, match=message):
            load_config(bad)
