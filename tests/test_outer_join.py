"""Linear aggregates over an outer join (:mod:`mvsink.desired.outer_join`): TPC-H Q13's customers
with their count of orders, sums and averages of the padded side per group of the kept side.
Which queries are (over the sources and over rows held in Spark, as a view checks them), and that
their changes (the inner join's terms and the kept side's rows padded, moving the groups' state)
equal the full evaluation at every time over random commits to every source."""

from __future__ import annotations

import random

import pytest

from helpers import maintained_against_the_query
from mvsink import MaterializedView, SnapshotInput, ViewDefinition
from mvsink.desired.linear_aggregate import aggregate_of_aggregate, aggregate_over_outer_join
from mvsink.desired.row_wise import HELD_ROWS, TABLE_SCAN
from test_per_key import _random_commits, _sources

#: TPC-H Q13's inner query: each customer's count of orders (0 for a customer without any).
ORDER_COUNT = ("SELECT c.cust, count(o.id) AS n FROM customers c LEFT JOIN orders o ON c.cust = o.cust "
               "GROUP BY c.cust")
#: Per segment: orders, the sum of an expression of their amounts and their mean (null: none).
SEGMENT_SUMS = ("SELECT c.segment, count(o.id) AS n, sum(o.amount * 2 + 1) AS s, avg(o.amount) AS mean "
                "FROM customers c LEFT JOIN orders o ON c.cust = o.cust GROUP BY c.segment")
#: The padded side an inner join itself: each customer's payments matching an order's amount.
PADDED_JOIN = ("SELECT c.cust, c.segment, count(op.paid) AS n, sum(op.paid) AS paid FROM customers c LEFT JOIN "
               "(SELECT o.cust, p.paid FROM orders o JOIN payments p ON o.amount = p.paid) op ON c.cust = op.cust "
               "GROUP BY c.cust, c.segment")
#: An inner join on the kept side, and a condition of the outer join on the kept side's column.
KEPT_JOIN = ("SELECT c.segment, count(o.id) AS n, sum(o.amount) AS a FROM customers c JOIN payments p "
             "ON c.cust = p.cust LEFT JOIN orders o ON c.cust = o.cust AND c.segment <> 'y' GROUP BY c.segment")
#: A condition of the outer join on the kept side alone: the customers of segment y match no order.
CONDITIONED = ("SELECT c.cust, count(o.id) AS n, sum(o.amount) AS a FROM customers c LEFT JOIN orders o "
               "ON c.cust = o.cust AND c.segment <> 'y' GROUP BY c.cust")
#: Under a top: an expression of the sum (a customer without orders: 0) and HAVING.
TOPPED = ("SELECT c.cust, coalesce(sum(o.amount), 0) AS a, count(o.id) AS n FROM customers c LEFT JOIN orders o "
          "ON c.cust = o.cust GROUP BY c.cust HAVING count(o.id) < 4")
RIGHT = ("SELECT c.cust, sum(o.amount) AS a, count(o.id) AS n FROM orders o RIGHT JOIN customers c "
         "ON o.cust = c.cust GROUP BY c.cust")
#: TPC-H Q13 itself: how many customers have each count of orders (a rollup of ORDER_COUNT).
CUSTOMERS_PER_COUNT = f"SELECT n, count(*) AS customers FROM ({ORDER_COUNT}) GROUP BY n"
#: A rollup of sums over the outer join, below it a top: per segment, its customers' totals (null
#: for a customer without orders) and how many customers have fewer than 3 orders.
SEGMENT_TOTALS = ("SELECT segment, sum(a) AS total, count(a) AS paying, count(*) AS customers FROM ("
                  "SELECT c.cust, c.segment, sum(o.amount) AS a FROM customers c LEFT JOIN orders o "
                  "ON c.cust = o.cust GROUP BY c.cust, c.segment HAVING count(o.id) < 3) GROUP BY segment")


@pytest.fixture(scope="module")
def unchanged_sources(spark, tmp_path_factory) -> dict[str, str]:
    return _sources(spark, tmp_path_factory.mktemp("outer_join_sources"))


@pytest.mark.parametrize("sql, padded", [
    (ORDER_COUNT, {"orders"}),
    (SEGMENT_SUMS, {"orders"}),
    (PADDED_JOIN, {"orders", "payments"}),
    (KEPT_JOIN, {"orders"}),
    (CONDITIONED, {"orders"}),
    (TOPPED, {"orders"}),
    (RIGHT, {"orders"}),
    ("SELECT c.cust, count(*) AS n FROM customers c LEFT JOIN orders o ON c.cust = o.cust GROUP BY c.cust",
     None),                                                                   # count(*) counts a padded row
    ("SELECT c.segment, sum(c.cust) AS s, count(o.id) AS n FROM customers c LEFT JOIN orders o "
     "ON c.cust = o.cust GROUP BY c.segment", None),                          # a sum of the kept side
    ("SELECT c.cust, sum(coalesce(o.amount, 1)) AS s FROM customers c LEFT JOIN orders o "
     "ON c.cust = o.cust GROUP BY c.cust", None),                             # not null where padded
    ("SELECT o.amount, count(o.id) AS n FROM customers c LEFT JOIN orders o ON c.cust = o.cust "
     "GROUP BY o.amount", None),                                              # grouped by the padded side
    ("SELECT c.cust, count(o.amount) AS n FROM customers c LEFT JOIN orders o ON c.cust = o.cust "
     "WHERE o.id IS NULL OR o.amount > 2 GROUP BY c.cust", None),             # a filter reading the padded side
    ("SELECT c.cust, count(o.id) AS n, count(p.paid) AS m FROM customers c LEFT JOIN orders o "
     "ON c.cust = o.cust LEFT JOIN payments p ON c.cust = p.cust GROUP BY c.cust", None),  # two outer joins
    ("SELECT c.cust, count(o.id) AS n FROM customers c FULL JOIN orders o ON c.cust = o.cust "
     "GROUP BY c.cust", None),                                                # a full outer join
    (CUSTOMERS_PER_COUNT, {"orders"}),
    (SEGMENT_TOTALS, {"orders"}),
    ("SELECT n, count(*) AS customers FROM (SELECT c.cust, count(*) AS n FROM customers c LEFT JOIN orders o "
     "ON c.cust = o.cust GROUP BY c.cust) GROUP BY n", None),                 # a rollup of a count(*) below
], ids=["order-count", "segment-sums", "padded-join", "kept-join", "conditioned", "topped", "right",
        "count-star", "kept-sum", "coalesce",
        "padded-groups", "padded-filter", "two-outer", "full",
        "rollup-count", "rollup-sums", "rollup-count-star"])
def test_which_queries_are_linear_aggregates_over_an_outer_join(spark, unchanged_sources, sql, padded):
    """Over the sources' scans and over rows held in Spark, each source read once (the padded
    side's sources named), as a view checks it; and the view's strategy."""
    for name, path in unchanged_sources.items():
        spark.read.format("delta").load(path).createOrReplaceTempView(name)
    rollup = sql.startswith("SELECT n,") or sql.startswith("SELECT segment,")
    sources = 3 if "payments" in sql else 2
    if rollup:
        shape, below, _ = aggregate_of_aggregate(spark.sql(sql), TABLE_SCAN, sources, top=True)
        assert (shape is not None and below is not None) == (padded is not None)
    else:
        shape, _ = aggregate_over_outer_join(spark.sql(sql), TABLE_SCAN, sources, top=True)
        assert (shape is not None) == (padded is not None)
    view = MaterializedView(spark, ViewDefinition("v", "/nonexistent/v", SnapshotInput(sql=sql),
                                                  sources=unchanged_sources, replica_id="r1"))
    assert view.desired.padded == (frozenset(padded) if padded else None)
    if padded:
        assert view.desired.aggregate is not None and view.desired.per_group is None
        assert (view.desired.below is not None) == rollup
        assert "outer join as the inner join plus every row of its kept side padded" in \
            view.desired.strategy_description()
    held = {name: spark.table(name).limit(0).localCheckpoint(eager=True) for name in unchanged_sources}
    for name, rows in held.items():
        rows.createOrReplaceTempView(name)
    _, leaves = (aggregate_of_aggregate(spark.sql(sql), HELD_ROWS, sources, top=True)[1:] if rollup
                 else aggregate_over_outer_join(spark.sql(sql), HELD_ROWS, sources, top=True))
    names = {rows._jdf.queryExecution().optimizedPlan().rdd().id(): name for name, rows in held.items()}
    assert ({names[leaf.rdd().id()] for leaf in leaves} if leaves is not None else None) == padded


@pytest.mark.parametrize("sql, key, without_feed", [
    (ORDER_COUNT, (), ("orders",)),
    (SEGMENT_SUMS, ("segment",), ()),
    (PADDED_JOIN, (), ("payments",)),
    (KEPT_JOIN, ("segment",), ("customers",)),
    (CONDITIONED, (), ()),
    (TOPPED, (), ("customers",)),
    (RIGHT, (), ()),
    (CUSTOMERS_PER_COUNT, ("n",), ("orders",)),
    (SEGMENT_TOTALS, ("segment",), ("customers",)),
], ids=["order-count-orders-no-feed", "segment-sums", "padded-join-payments-no-feed", "kept-join-customers-no-feed",
        "conditioned", "topped-customers-no-feed", "right", "rollup-count-orders-no-feed",
        "rollup-sums-customers-no-feed"])
def test_linear_aggregates_over_an_outer_join_equal_the_full_evaluation_at_every_time(
        spark, tmp_path, strategies, sql, key, without_feed):
    """Random commits to orders, customers and payments (duplicates, null keys, orders moving
    customer, customers appearing and leaving, so groups of no orders and groups emptying; deletes
    on several sides in one time), a source without change data feed, (for three of them) a
    replica catching up over every time at once: at every time the view equals the full evaluation, and every range moved
    the groups' state by the inner join's terms and the kept side's padded rows."""
    rng = random.Random(47)
    sources = _sources(spark, tmp_path, rng)
    edit = _random_commits(spark, sources, rng, without_feed, orders=0.6)
    late = sql in (PADDED_JOIN, CONDITIONED, CUSTOMERS_PER_COUNT)
    view = maintained_against_the_query(spark, tmp_path, sources, sql, edit, rounds=4, rng=rng, key=key, late=late)
    assert view.desired.padded and view.desired._previous is None
    rollup = sql in (CUSTOMERS_PER_COUNT, SEGMENT_TOTALS)
    assert (view.desired.below is not None) == rollup
    assert strategies and set(strategies) == {"linear aggregate of linear aggregate" if rollup
                                              else "linear aggregate"}, strategies


def test_a_customer_no_order_matches_keeps_its_row_as_its_orders_go(spark, tmp_path):
    """A customer the outer join's condition never matches (segment y), its orders deleted: the
    orders' term, an inner join, has no row of it (a left join would pad it at -1 and empty its
    group), and its row stays, with no orders."""
    rng = random.Random(5)
    sources = _sources(spark, tmp_path, rng)
    commits = iter([f"DELETE FROM delta.`{sources['orders']}` WHERE cust = 1",
                    f"INSERT INTO delta.`{sources['orders']}` VALUES (500, 1, 3)"])
    view = maintained_against_the_query(spark, tmp_path, sources, CONDITIONED,
                                        lambda: spark.sql(next(commits, "SELECT 1")), rounds=2, rng=rng)
    assert view.desired.padded == {"orders"}
    rows = {r.cust: (r.n, r.a) for r in spark.read.format("delta").load(str(tmp_path / "maintained")).collect()}
    assert rows[1] == (0, None)
