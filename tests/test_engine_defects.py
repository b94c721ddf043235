"""Defects of the maintained strategies, each beside the query evaluated in full at every time:
an anti-join written as an outer join and ``IS NULL`` (aggregated, rolled up, and its rows alone;
and as ``NOT EXISTS``) follows changes of its padded side; an aggregate under an expression over
a semi join (``EXISTS``) of sources with deletion vectors, whose step plans the optimizer gives
runtime filters, keeps its strategy, and a replica started later follows it too; a correlated
scalar subquery stays maintained over a late replica's step of several times; and a step whose
strategy fails (a failpoint raising) is evaluated in full for its times, logged, exactly, and the
next step is maintained again, while a configuration error still stops the step."""

from __future__ import annotations

import datetime
import logging
from decimal import Decimal

import pytest

from helpers import create_source, insert, query_results_at_every_time
from mvsink import MaterializedView, SnapshotInput, ViewDefinition, failpoints
from mvsink.timeline import REASON_SOURCES
from mvsink.view import ConfigError

CUSTOMER = [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2)]
ORDERS = [(10, 1, 0), (11, 2, 0), (12, 3, 0), (13, 4, 0), (14, 5, 0), (15, 6, 0)]
#: Customers per nation without an order of priority other than 0: an anti-join as an outer join.
ANTI_PRIORITY = ("SELECT c.c_nationkey, count(*) AS n FROM customer c LEFT JOIN orders o "
                 "ON c.c_custkey = o.o_custkey AND o.o_shippriority <> 0 WHERE o.o_orderkey IS NULL "
                 "GROUP BY c.c_nationkey")
ANTI_JOINS = {
    "v": ANTI_PRIORITY,
    "plain": ("SELECT c.c_nationkey, count(*) AS n FROM customer c LEFT JOIN orders o ON c.c_custkey = o.o_custkey "
              "WHERE o.o_orderkey IS NULL GROUP BY c.c_nationkey"),
    "highest": ("SELECT c.c_nationkey, max(c.c_custkey) AS m FROM customer c LEFT JOIN orders o "
                "ON c.c_custkey = o.o_custkey WHERE coalesce(o.o_shippriority, 0) = 0 GROUP BY c.c_nationkey"),
    "rollup": f"SELECT n, count(*) AS nations FROM ({ANTI_PRIORITY}) GROUP BY n",
    "rows": ("SELECT c.c_custkey, c.c_nationkey FROM customer c LEFT JOIN orders o ON c.c_custkey = o.o_custkey "
             "AND o.o_shippriority <> 0 WHERE o.o_orderkey IS NULL"),
    "not_exists": ("SELECT c.c_nationkey, count(*) AS n FROM customer c WHERE NOT EXISTS (SELECT 1 FROM orders o "
                   "WHERE o.o_custkey = c.c_custkey AND o.o_shippriority <> 0) GROUP BY c.c_nationkey"),
}


def test_an_anti_join_follows_its_padded_side(spark, tmp_path, strategies):
    """Orders gaining and losing a priority, deleted, inserted, and a customer moving nation: every
    form of the anti-join equals the query at every time, maintained: the counts moved by the
    anti-join's rows of the changed customers, recomputed (the aggregate of the join per group,
    with ``max``, is test_per_key's ``segment-anti``)."""
    sources = {"customer": str(tmp_path / "customer"), "orders": str(tmp_path / "orders")}
    create_source(spark, sources["customer"], CUSTOMER, "c_custkey BIGINT, c_nationkey BIGINT")
    create_source(spark, sources["orders"], ORDERS, "o_orderkey BIGINT, o_custkey BIGINT, o_shippriority INT")
    views = {name: MaterializedView(spark, ViewDefinition(name, str(tmp_path / name), SnapshotInput(sql=sql, refresh="incremental"),
                                                          sources=sources, replica_id="r1"))
             for name, sql in ANTI_JOINS.items()}
    orders = sources["orders"]
    for commit in [None,
                   f"UPDATE delta.`{orders}` SET o_shippriority = o_shippriority + 1 WHERE o_orderkey IN (10, 11, 14)",
                   f"DELETE FROM delta.`{orders}` WHERE o_orderkey IN (12, 13)",
                   f"UPDATE delta.`{orders}` SET o_shippriority = 0 WHERE o_orderkey = 10",
                   f"UPDATE delta.`{sources['customer']}` SET c_nationkey = 3 WHERE c_custkey = 2",
                   f"DELETE FROM delta.`{orders}`"]:
        if commit is not None:
            spark.sql(commit)
        if commit == f"DELETE FROM delta.`{orders}`":
            insert(spark, orders, [(16, 3, 2), (17, 4, 0)])
        for view in views.values():
            view.run_until_caught_up()
    for name, view in views.items():
        assert view.desired.per_group is not None, name
        linear_over_keys = view.desired.aggregate is not None and view.desired.per_group.joins
        assert linear_over_keys == (name in {"v", "plain", "not_exists"}), name
        query_results_at_every_time(spark, sources, ANTI_JOINS[name], {name: str(tmp_path / name)},
                                    str(tmp_path / name) + "_timeline", view.observed_upper)
    assert set(strategies) == {"linear aggregate of per-key recompute"}, strategies


def _deletion_vectors_source(spark, path: str, schema: str, rows: list[tuple]) -> None:
    spark.sql(f"CREATE TABLE delta.`{path}` ({schema}) USING delta TBLPROPERTIES "
              "(delta.enableChangeDataFeed = true, delta.enableDeletionVectors = true)")
    insert(spark, path, rows)


#: An expression of an average over a join and a semi join (TPC-H-like, the key the part).
DISCOUNTS = ("SELECT year(l.l_shipdate) AS e0, p.p_mfgr, avg(l.l_discount) * 2 AS a0 "
             "FROM lineitem l JOIN part p ON l.l_partkey = p.p_partkey "
             "WHERE EXISTS (SELECT 1 FROM partsupp ps WHERE ps.ps_partkey = l.l_partkey "
             "AND ps.ps_suppkey = l.l_suppkey) GROUP BY year(l.l_shipdate), p.p_mfgr")


def test_an_aggregate_under_an_expression_over_sources_with_deletion_vectors(spark, tmp_path, strategies):
    """A partsupp row deleted, a fifth of lineitem deleted, the row back, a part's maker changed,
    all with deletion vectors: the optimizer gives the steps' plans runtime filters (subqueries
    of its own), which the strategy reads through; its view, and a replica that caught up only at
    the end over every time at once, equal the query at every time."""
    sources = {name: str(tmp_path / name) for name in ("lineitem", "part", "partsupp")}
    _deletion_vectors_source(spark, sources["lineitem"], "l_orderkey BIGINT, l_partkey BIGINT, l_suppkey BIGINT, "
                             "l_discount DECIMAL(12,2), l_shipdate DATE",
                             [(i, 1 + i % 3, 1 + i % 4, Decimal(i % 10) / 100,
                               datetime.date(1994 + i % 3, 1 + i % 12, 1)) for i in range(60)])
    _deletion_vectors_source(spark, sources["part"], "p_partkey BIGINT, p_mfgr STRING",
                             [(1, "m1"), (2, "m2"), (3, "m1")])
    _deletion_vectors_source(spark, sources["partsupp"], "ps_partkey BIGINT, ps_suppkey BIGINT",
                             [(p, s) for p in range(1, 4) for s in range(1, 5)])
    first = _with_a_late_replica(spark, tmp_path, sources, DISCOUNTS, [
        f"DELETE FROM delta.`{sources['partsupp']}` WHERE ps_partkey = 1 AND ps_suppkey = 2",
        f"DELETE FROM delta.`{sources['lineitem']}` WHERE l_orderkey % 5 = 0",
        f"INSERT INTO delta.`{sources['partsupp']}` VALUES (1, 2)",
        f"UPDATE delta.`{sources['part']}` SET p_mfgr = 'm3' WHERE p_partkey = 3"])
    # the view's own session plans no runtime bloom filter: the optimizer put one (a Spark job) on
    # each side of unknown size in the strategy's terms, stacked: 10-20 s a step over these 60 rows
    assert first.desired.session().conf.get("spark.sql.optimizer.runtime.bloomFilter.enabled") == "false"
    assert strategies and "full evaluation" not in strategies, strategies


def _with_a_late_replica(spark, tmp_path, sources: dict[str, str], sql: str, commits: list[str]) -> MaterializedView:
    """The view ``v`` of ``sql`` (replica r1) stepped after each of ``commits``, and its replica r2,
    hydrated at the start and caught up only at the end, over every time in one step: both hold
    the same times, and the view equals the query at every one. Returns r1."""

    def view(replica: str) -> MaterializedView:
        return MaterializedView(spark, ViewDefinition("v", str(tmp_path / "v"), SnapshotInput(sql=sql, refresh="incremental"),
                                                      sources=sources, replica_id=replica))
    late, first = view("r2"), view("r1")
    late.run_until_caught_up()
    first.run_until_caught_up()
    for commit in commits:
        spark.sql(commit)
        first.run_until_caught_up()
    late.run_until_caught_up()
    assert first.observed_upper == late.observed_upper >= len(commits) + 1
    query_results_at_every_time(spark, sources, sql, {"v": str(tmp_path / "v")}, str(tmp_path / "v_timeline"),
                                first.observed_upper)
    return first


#: Each nation's count of distinct customers: a correlated scalar subquery in the projection.
RELATED = ("SELECT n.n_name, n.n_nationkey, (SELECT count(DISTINCT s.c_custkey) FROM customer s "
           "WHERE s.c_nationkey = n.n_nationkey) AS related FROM nation n")


def test_a_correlated_scalar_subquery_is_maintained_by_a_replica_catching_up_over_several_times(
        spark, tmp_path, strategies):
    """The differential tester's seed 9121, shrunk: a late replica's one step over two times,
    customers added then a nation renamed, by Spark. That step read nation as a union of its rows,
    and Spark's optimizer, pushing the projection with the subquery through that union, failed
    (``key not found: c_nationkey``): the step was evaluated in full. Now every step of both
    replicas is maintained and both equal the query at every time."""
    sources = {"nation": str(tmp_path / "nation"), "customer": str(tmp_path / "customer")}
    nation, customer = sources["nation"], sources["customer"]
    for path, schema in ((nation, "n_nationkey INT, n_name STRING, n_region INT"),
                         (customer, "c_custkey BIGINT, c_nationkey INT, c_segment STRING")):
        spark.sql(f"CREATE TABLE delta.`{path}` ({schema}) USING delta "
                  "TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    spark.sql(f"INSERT INTO delta.`{nation}` VALUES (0, 'ASIA', 0), (1, 'EU', 2), (2, NULL, 0), (3, 'ASIA', 1)")
    spark.sql(f"INSERT INTO delta.`{customer}` VALUES (1, 3, 'AUTO'), (2, 3, 'BUILD'), (3, 4, 'BUILD'), "
              "(4, 1, 'BUILD'), (5, 4, 'AUTO'), (6, 5, 'AUTO'), (7, 1, 'AUTO'), (8, 0, 'AUTO'), (9, 3, 'BUILD'), "
              "(10, 0, 'AUTO'), (11, 0, 'FURN'), (12, 4, 'AUTO'), (11, 5, 'BUILD'), (11, NULL, 'FURN'), "
              "(8, 0, 'AUTO'), (11, 5, 'BUILD')")
    _with_a_late_replica(spark, tmp_path, sources, RELATED, [
        f"INSERT INTO delta.`{customer}` VALUES (11, 5, 'AUTO'), (5, 2, 'FURN'), (7, 4, 'BUILD'), (11, 5, 'AUTO')",
        f"UPDATE delta.`{nation}` SET n_name = 'US' WHERE pmod(n_nationkey, 4) = 1"])
    assert strategies and "full evaluation" not in strategies, strategies


@pytest.fixture
def failing_step(monkeypatch) -> list[BaseException]:
    """The failpoint ``maintained-changes`` (a maintained step's changes computed, not returned)
    raising the exceptions put in the list, one per step that reaches it, as long as there are."""
    failures: list[BaseException] = []
    hit = failpoints.hit

    def raising(name: str) -> None:
        if name == "maintained-changes" and failures:
            raise failures.pop(0)
        hit(name)

    monkeypatch.setattr(failpoints, "hit", raising)
    return failures


SUMS = "SELECT grp, count(*) AS n, sum(qty) AS q, max(qty) AS m FROM src GROUP BY grp"


def test_a_failing_step_is_evaluated_in_full(spark, tmp_path, caplog, failing_step):
    """A step over several times whose strategy raises: those times are evaluated in full (the
    report says why, the log names the view, the times and the reason), the view stays exact, and
    the next step is maintained again from the sources (what the failed step held dropped)."""
    src, target = str(tmp_path / "src"), str(tmp_path / "v")
    create_source(spark, src, [(i, "ab"[i % 2], i) for i in range(10)], "id BIGINT, grp STRING, qty INT")
    view = MaterializedView(spark, ViewDefinition("v", target, SnapshotInput(sql=SUMS, refresh="incremental"),
                                                  sources={"src": src}, replica_id="r1"))
    view.run_until_caught_up()
    view.run_until_caught_up()
    for commit in [lambda: insert(spark, src, [(20, "a", 7), (21, "c", 1)]),
                   lambda: spark.sql(f"UPDATE delta.`{src}` SET qty = qty + 1 WHERE grp = 'b'")]:
        commit()  # a time each, minted here: one step computes both
        assert view.timeline.extend(view.desired.latest_versions(), REASON_SOURCES, at=view.timeline.refresh())
    failing_step.append(RuntimeError("injected: the strategy broke"))
    with caplog.at_level(logging.WARNING, logger="mvsink.desired.snapshot"):
        reports = [view.step() for _ in range(3)]
    failed = [r for r in reports if r.fallback is not None]
    assert len(failed) == 1 and failed[0].fallback.kind == "failed" and failed[0].strategy == "full evaluation"
    assert "injected: the strategy broke" in str(failed[0].fallback)
    warned = [r.getMessage() for r in caplog.records if "its strategy failed" in r.getMessage()]
    assert len(warned) == 1 and "view 'v'" in warned[0] and "injected: the strategy broke" in warned[0], warned
    spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 20")
    report = view.run_until_caught_up()
    assert not failing_step
    query_results_at_every_time(spark, src, SUMS, {"v": target}, target + "_timeline", view.observed_upper)
    assert view.observed_upper >= 4 and report.fallback is None


def test_a_configuration_error_in_a_step_still_stops_it(spark, tmp_path, failing_step):
    """A fence or bad configuration raised in the strategy (a :class:`ConfigError`) is not evaluated
    in full: the step raises it."""
    src = str(tmp_path / "src")
    create_source(spark, src, [(1, "a", 1)], "id BIGINT, grp STRING, qty INT")
    view = MaterializedView(spark, ViewDefinition("v", str(tmp_path / "v"), SnapshotInput(sql=SUMS),
                                                  sources={"src": src}, replica_id="r1"))
    view.run_until_caught_up()
    insert(spark, src, [(2, "b", 2)])
    failing_step.append(ConfigError("injected: bad configuration"))
    with pytest.raises(ConfigError, match="injected"):
        view.run_until_caught_up()
