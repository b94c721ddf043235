"""Key joins (:mod:`mvsink.desired.per_group`): outer, semi and anti joins of several sources by a
key every join equates, and aggregates over them grouped by the key. Which queries are, and that
their changes (the keys the sources' changes touch, recomputed before and after) equal the full
evaluation at every time over random commits to every source; that a step reads only the changed
keys' files; and the strategy the view reports, explains and is refused without. Linear aggregates
over such queries and over linear aggregates (rollups), the same way."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from helpers import commit_sql, create_source, edit_customers, edit_orders, insert, maintained_against_the_query
from mvsink import ConfigError, MaterializedView, SnapshotInput, ViewDefinition
from mvsink.desired import changes as changes_module
from mvsink.desired.linear_aggregate import aggregate_of_aggregate, aggregate_of_groups
from mvsink.desired.per_group import PerGroup, per_group
from mvsink.desired.row_wise import HELD_ROWS, TABLE_SCAN

ORDERS, CUSTOMERS, PAYMENTS = "id BIGINT, cust BIGINT, amount INT", "cust BIGINT, segment STRING", "cust BIGINT, paid INT"
LEFT = "SELECT o.id, o.amount, c.segment FROM orders o LEFT JOIN customers c ON o.cust = c.cust"
FULL = ("SELECT o.id, c.cust, c.segment FROM orders o FULL JOIN customers c "
        "ON o.cust = c.cust AND o.amount > 1")
ANTI = "SELECT o.id, o.cust FROM orders o WHERE NOT EXISTS (SELECT 1 FROM customers c WHERE c.cust = o.cust)"
AGGREGATE = ("SELECT o.cust, max(o.amount) AS top, count(DISTINCT c.segment) AS kinds, count(*) AS n "
             "FROM orders o LEFT JOIN customers c ON o.cust = c.cust GROUP BY o.cust")
THREE = ("SELECT o.id, c.segment, p.paid FROM orders o LEFT JOIN customers c ON o.cust = c.cust "
         "LEFT JOIN payments p ON p.cust = o.cust WHERE coalesce(p.paid, 0) <> 3")
#: A view over an aggregate view: each customer with its orders' count and largest amount.
OVER_AGGREGATE = ("SELECT c.cust, c.segment, t.n, t.top FROM customers c JOIN "
                  "(SELECT cust, count(*) AS n, max(amount) AS top FROM orders GROUP BY cust) t ON c.cust = t.cust")
STRATEGY = "per-key recompute"
BY_CUST = {"orders": ("cust",), "customers": ("cust",)}
#: The customers' keys (and null): enough that a time's commits leave some keys alone.
KEYS = 12


def _sources(spark, tmp_path, rng: random.Random | None = None) -> dict[str, str]:
    """Orders, customers and payments (by customer), a few rows each (duplicates, null keys)."""
    rng = rng or random.Random(0)
    sources = {name: str(tmp_path / name) for name in ("orders", "customers", "payments")}
    create_source(spark, sources["orders"], [(i, rng.choice([*range(1, KEYS), None]), rng.randint(0, 5))
                                             for i in range(30)], ORDERS)
    create_source(spark, sources["customers"], [(c, "xyz"[c % 3]) for c in range(1, KEYS, 2)] + [(2, "y"), (None, "x")],
                  CUSTOMERS)
    create_source(spark, sources["payments"], [(1, 3), (2, 4), (4, 1), (7, 0), (None, 2)], PAYMENTS)
    return sources


@pytest.fixture(scope="module")
def unchanged_sources(spark, tmp_path_factory) -> dict[str, str]:
    """:func:`_sources` for the tests that only read them, made once."""
    return _sources(spark, tmp_path_factory.mktemp("key_join_sources"))


@pytest.fixture(scope="module")
def held_rows(spark, unchanged_sources) -> dict:
    """Rows held in Spark (none) for each of :func:`unchanged_sources`, in its columns, as a view
    holds them: made once (a Spark job each)."""
    return {name: spark.read.format("delta").load(path).limit(0).localCheckpoint(eager=True)
            for name, path in unchanged_sources.items()}


@pytest.mark.parametrize("sql, keys", [
    (LEFT, BY_CUST),
    ("SELECT o.id, c.segment FROM customers c RIGHT JOIN orders o ON c.cust = o.cust", BY_CUST),
    (FULL, BY_CUST),
    (ANTI, BY_CUST),
    ("SELECT o.id FROM orders o WHERE o.cust IN (SELECT cust FROM customers)", BY_CUST),  # a semi join
    (AGGREGATE, BY_CUST),
    ("SELECT o.cust, o.amount, min(c.segment) AS s FROM orders o JOIN customers c ON o.cust = c.cust "
     "GROUP BY o.cust, o.amount", BY_CUST),                                  # the key and more
    (THREE, {**BY_CUST, "payments": ("cust",)}),
    ("SELECT o.id, c.segment FROM orders o LEFT JOIN customers c ON o.cust = c.cust AND o.id = c.cust",
     None),                                                                  # a leaf with two key columns
    ("SELECT c.segment, max(o.amount) AS m FROM orders o LEFT JOIN customers c ON o.cust = c.cust "
     "GROUP BY c.segment", None),                                            # groups span keys
    ("SELECT c.cust, max(o.amount) AS m FROM orders o LEFT JOIN customers c ON o.cust = c.cust "
     "GROUP BY c.cust", None),                                               # the padded side's key
    ("SELECT max(o.amount) AS m FROM orders o LEFT JOIN customers c ON o.cust = c.cust", None),
    ("SELECT o.id, c.segment FROM orders o LEFT JOIN customers c ON o.cust < c.cust", None),  # not equi
    ("SELECT o.id, c.segment FROM orders o LEFT JOIN customers c ON o.cust + 1 = c.cust", None),  # computed
    ("SELECT o.id, p.paid FROM orders o LEFT JOIN customers c ON o.cust = c.cust "
     "LEFT JOIN payments p ON p.cust = o.id", None),                         # two keys, neither everywhere
    ("SELECT o.id, c.segment FROM orders o LEFT JOIN customers c ON o.cust = c.cust WHERE rand() > 0.5", None),
    ("SELECT a.id, b.amount FROM orders a LEFT JOIN orders b ON a.cust = b.cust", None),  # a source read twice
    ("SELECT o.cust, sum(CAST(o.amount AS DOUBLE)) AS s FROM orders o LEFT JOIN customers c ON o.cust = c.cust "
     "GROUP BY o.cust", None),                                               # a float sum
    (OVER_AGGREGATE, BY_CUST),
    ("SELECT t.cust, t.amount, c.segment FROM (SELECT cust, amount, count(*) AS n FROM orders GROUP BY cust, amount) t "
     "LEFT JOIN customers c ON c.cust = t.cust WHERE t.n > 1", BY_CUST),      # grouped by the key and more
    ("SELECT c.cust, t.n FROM customers c JOIN (SELECT amount, count(*) AS n FROM orders GROUP BY amount) t "
     "ON c.cust = t.n", None),                                               # joined on an aggregate's result
    ("SELECT c.cust, t.s FROM customers c JOIN (SELECT cust, sum(CAST(amount AS DOUBLE)) AS s FROM orders "
     "GROUP BY cust) t ON c.cust = t.cust", None),                           # a float sum below the join
    ("SELECT c.cust, t.n FROM customers c JOIN (SELECT o.cust, count(*) AS n FROM orders o JOIN payments p "
     "ON o.cust = p.cust GROUP BY o.cust) t ON c.cust = t.cust", None),      # an aggregate of a join
], ids=["left", "right", "full", "anti", "semi", "aggregate", "key-and-more", "three", "same-leaf-twice",
        "groups-span-keys", "padded-key", "no-group-by", "non-equi", "computed", "two-keys", "rand", "self",
        "double-sum", "over-aggregate", "over-aggregate-by-more", "over-aggregate-result", "over-float-sum",
        "over-aggregate-of-join"])
def test_which_queries_are_key_joins(spark, unchanged_sources, held_rows, sql, keys):
    """Over rows held in Spark, each source read once, as a view checks it."""
    over_sources, shape, _ = _shapes(spark, unchanged_sources, held_rows, sql, per_group)
    assert shape == (PerGroup(keys) if keys else None)
    if keys is not None:  # the shape checked over the sources first
        assert over_sources is not None


def _shapes(spark, sources: dict[str, str], held: dict, sql: str, shape: Callable):
    """``shape(query, scan, names)`` of ``sql`` over the ``sources``' tables, and over the rows
    ``held`` in Spark for each (:func:`held_rows`), registered under the sources' names, as a view
    checks it; and the names of those rows' leaves (by their RDDs' ids)."""
    for name, path in sources.items():
        spark.read.format("delta").load(path).createOrReplaceTempView(name)
    over_sources = shape(spark.sql(sql), TABLE_SCAN, None)
    for name in sources:
        held[name].createOrReplaceTempView(name)
    names = {rows._jdf.queryExecution().optimizedPlan().rdd().id(): name for name, rows in held.items()}
    return over_sources, shape(spark.sql(sql), HELD_ROWS, names), names


#: Linear aggregates over per-group queries: TPC-H Q13's shape with count(*) (customers by their
#: count of rows of a left join, 1 without orders: not linear, it is no rollup), an aggregate over
#: an outer join grouped by a column of the padded side, and an aggregate of an aggregate of one source.
BY_ORDER_COUNT = ("SELECT n, count(*) AS customers, sum(cust) AS custs FROM (SELECT c.cust, count(*) AS n "
                  "FROM customers c LEFT JOIN orders o ON c.cust = o.cust GROUP BY c.cust) GROUP BY n")
BY_SEGMENT = ("SELECT c.segment, count(o.id) AS orders, sum(o.amount) AS amount, avg(o.amount) AS mean, "
              "count(*) AS n FROM orders o LEFT JOIN customers c ON o.cust = c.cust GROUP BY c.segment")
BY_TOP = "SELECT top, count(*) AS n FROM (SELECT cust, max(amount) AS top FROM orders GROUP BY cust) GROUP BY top"


@pytest.mark.parametrize("sql, keys", [
    (BY_ORDER_COUNT, {"customers": ("cust",), "orders": ("cust",)}),
    (BY_SEGMENT, BY_CUST),
    (BY_TOP, {"orders": ("cust",)}),
    ("SELECT n, max(cust) AS m FROM (SELECT c.cust, count(o.id) AS n FROM customers c LEFT JOIN orders o "
     "ON c.cust = o.cust GROUP BY c.cust) GROUP BY n", None),                # max over it: not linear
    ("SELECT c.segment, sum(CAST(o.amount AS DOUBLE)) AS s FROM orders o LEFT JOIN customers c "
     "ON o.cust = c.cust GROUP BY c.segment", None),                         # a float sum over it
    ("SELECT top, count(*) AS n FROM (SELECT o.cust, max(o.amount) AS top FROM orders o JOIN payments p "
     "ON o.id = p.paid GROUP BY o.cust) GROUP BY top",
     PerGroup({"orders": ("cust",)}, ("payments",), (0,))),                        # over an aggregate of an inner join
    ("SELECT top, count(*) AS n FROM (SELECT o.cust, max(p.cust) AS top FROM orders o LEFT JOIN payments p "
     "ON o.id = p.paid GROUP BY o.cust) GROUP BY top",
     PerGroup({"orders": ("cust",)}, ("payments",), (0,))),                        # over an aggregate of a left join
    ("SELECT c.segment, count(*) AS n FROM orders o LEFT JOIN customers c ON o.cust < c.cust "
     "GROUP BY c.segment", None),                                            # over a non-equi join
], ids=["by-order-count", "by-segment", "by-top", "max-over", "float-sum-over", "over-inner-join-groups",
        "over-left-join-groups", "over-non-equi"])
def test_which_queries_are_linear_aggregates_of_groups(spark, unchanged_sources, held_rows, sql, keys):
    """A linear aggregate over a per-group query, over rows held in Spark, each source read once,
    as a view checks it (and over the sources first)."""
    shape_over_sources, (aggregate, shape), names = _shapes(spark, unchanged_sources, held_rows, sql,
                                                            aggregate_of_groups)
    assert shape == (keys if isinstance(keys, PerGroup) else PerGroup(keys) if keys else None)
    assert (aggregate is not None) == (keys is not None) == (shape_over_sources[0] is not None)
    assert per_group(spark.sql(sql), HELD_ROWS, names) is None  # not per-group itself


#: Aggregates of inner joins grouped by columns of their sources, not a key every join equates:
#: the largest order per segment (customers hold the groups), and per customer the distinct
#: segments and largest payment matching an order's amount (orders and customers hold them).
SEGMENT_MAX = ("SELECT c.segment, max(o.amount) AS top, count(DISTINCT o.id) AS n FROM orders o JOIN customers c "
               "ON o.cust = c.cust GROUP BY c.segment")
PAID_MAX = ("SELECT o.cust, count(DISTINCT c.segment) AS kinds, max(p.paid) AS paid FROM orders o JOIN customers c "
            "ON o.cust = c.cust JOIN payments p ON p.paid = o.amount GROUP BY o.cust")
BY_ORDER = ("SELECT o.id, min(c.segment) AS s, max(p.paid) AS paid FROM orders o JOIN customers c ON o.cust = c.cust "
            "JOIN payments p ON p.cust = c.cust GROUP BY o.id HAVING count(*) > 1")
#: Aggregates of joins with outer and anti joins among them, grouped by columns of a source no
#: outer join pads: per segment, the customers' orders (none: a row padded with nulls); the
#: customers' orders and the payments matching their amounts; per customer of the orders, its
#: customers' segments (a padded side holding the groups) and the payments matching the amounts;
#: the customers without orders.
SEGMENT_LEFT = ("SELECT c.segment, max(o.amount) AS top, count(o.id) AS n, count(*) AS all FROM customers c "
                "LEFT JOIN orders o ON o.cust = c.cust GROUP BY c.segment")
SEGMENT_LEFT_LEFT = ("SELECT c.segment, max(p.paid) AS paid, count(DISTINCT o.id) AS n, count(*) AS all "
                     "FROM customers c LEFT JOIN orders o ON o.cust = c.cust LEFT JOIN payments p ON p.paid = o.amount "
                     "GROUP BY c.segment")
CUST_LEFT_LEFT = ("SELECT o.cust, max(c.segment) AS s, count(p.paid) AS n, max(p.paid) AS top FROM orders o "
                  "LEFT JOIN customers c ON c.cust = o.cust LEFT JOIN payments p ON p.paid = o.amount GROUP BY o.cust")
#: TPC-H Q4's shape: a count over a semi join, grouped by a column of few values that is not its key.
EXISTS_BY_SEGMENT = ("SELECT c.segment, count(*) AS n, sum(c.cust) AS s FROM customers c WHERE EXISTS "
                     "(SELECT 1 FROM orders o WHERE o.cust = c.cust AND o.amount > 2) GROUP BY c.segment")
SEGMENT_ANTI = ("SELECT c.segment, max(c.cust) AS top, count(*) AS n FROM customers c "
                "WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.cust = c.cust) GROUP BY c.segment")
#: TPC-H Q17's shape: a sum over orders whose amount is below their customer's average, a
#: correlated scalar subquery (orders read twice; Spark joins the second read's aggregate by the key).
BELOW_CUSTOMERS_AVERAGE = ("SELECT sum(o.amount) AS total, count(*) AS n FROM orders o JOIN customers c ON c.cust = o.cust "
                           "WHERE c.segment <> 'z' AND o.amount < (SELECT avg(o2.amount) FROM orders o2 "
                           "WHERE o2.cust = c.cust)")
#: TPC-H Q21's shape: per segment, the orders some other customer's order of the same amount
#: matches and none of those with a larger id does (orders read three times, semi and anti joins
#: with a non-equi condition; the groups in none of the orders' reads, each read whole).
MATCHED_NOT_OUTBID = ("SELECT c.segment, count(*) AS n FROM customers c JOIN orders o1 ON o1.cust = c.cust "
                      "WHERE EXISTS (SELECT 1 FROM orders o2 WHERE o2.amount = o1.amount AND o2.cust <> o1.cust) "
                      "AND NOT EXISTS (SELECT 1 FROM orders o3 WHERE o3.amount = o1.amount AND o3.cust <> o1.cust "
                      "AND o3.id > o1.id) GROUP BY c.segment")
#: TPC-H Q18's shape: orders read twice, once in a grouped subquery with ``HAVING`` under a semi
#: join (which the optimizer repeats for the join's other side), grouped by the key both reads
#: hold, payments joined by another column (read whole).
BY_CUST_IN_HAVING = ("SELECT c.cust, c.segment, sum(o.amount) AS total, max(p.paid) AS paid, count(*) AS n "
                     "FROM customers c JOIN orders o ON o.cust = c.cust JOIN payments p ON p.paid = o.amount "
                     "WHERE c.cust IN (SELECT cust FROM orders GROUP BY cust HAVING sum(amount) > 6) "
                     "GROUP BY c.cust, c.segment")


@pytest.mark.parametrize("sql, keys, whole, grouping", [
    (SEGMENT_MAX, {"customers": ("segment",)}, ("orders",), (0,)),
    (PAID_MAX, BY_CUST, ("payments",), (0,)),
    (BY_ORDER, {"orders": ("id",)}, ("customers", "payments"), (0,)),
    ("SELECT c.segment, o.cust, max(o.amount) AS m FROM customers c JOIN orders o ON o.cust = c.cust "
     "JOIN payments p ON p.paid = o.amount GROUP BY c.segment, o.cust",
     BY_CUST, ("payments",), (1,)),                      # the column two sources hold, not both of the first's
    ("SELECT o.id, c.segment, max(p.paid) AS m FROM orders o JOIN customers c ON o.cust = c.cust "
     "JOIN payments p ON p.paid = o.amount GROUP BY o.id, c.segment",
     {"orders": ("id",)}, ("customers", "payments"), (0,)),                  # each held by one: the first
    ("SELECT c.segment, c.cust, max(o.amount) AS m FROM orders o JOIN customers c ON o.amount < c.cust "
     "GROUP BY c.segment, c.cust", {"customers": ("segment", "cust")}, ("orders",), (0, 1)),  # one holds both
    ("SELECT o.amount + 1 AS a, max(o.id) AS m FROM orders o JOIN customers c ON o.cust = c.cust "
     "GROUP BY o.amount + 1", None, None, None),                             # a computed group
    ("SELECT c.segment, max(o.amount) AS m FROM orders o JOIN customers c ON o.cust = c.cust "
     "WHERE rand() > 0.5 GROUP BY c.segment", None, None, None),             # not deterministic
    ("SELECT c.segment, sum(CAST(o.amount AS DOUBLE)) AS s FROM orders o JOIN customers c ON o.cust = c.cust "
     "GROUP BY c.segment", None, None, None),                                # a float sum
    ("SELECT c.segment, max(o.amount) AS m FROM orders o JOIN customers c ON o.cust < c.cust "
     "GROUP BY c.segment", {"customers": ("segment",)}, ("orders",), (0,)),  # not an equi-join: still linear
    ("SELECT max(o.amount) AS m FROM orders o JOIN customers c ON o.cust = c.cust", None, None, None),  # no group
    ("SELECT a.cust, max(b.amount) AS m FROM orders a JOIN orders b ON a.id = b.cust GROUP BY a.cust",
     None, None, None),                                                      # a source read twice
    (SEGMENT_LEFT, {"customers": ("segment",)}, ("orders",), (0,)),
    (SEGMENT_LEFT_LEFT, {"customers": ("segment",)}, ("orders", "payments"), (0,)),
    (SEGMENT_ANTI, {"customers": ("segment",)}, ("orders",), (0,)),
    (CUST_LEFT_LEFT, BY_CUST, ("payments",), (0,)),
    ("SELECT c.segment, max(o.amount) AS m FROM customers c JOIN orders o ON o.cust = c.cust "
     "WHERE c.cust IN (SELECT cust FROM payments) GROUP BY c.segment",
     None, None, None),                                      # a subquery repeated by the optimizer, read whole
    ("SELECT o.cust, o.amount, max(c.segment) AS s FROM orders o LEFT JOIN customers c ON c.cust = o.cust "
     "JOIN payments p ON p.paid = o.id GROUP BY o.cust, o.amount",
     BY_CUST, ("payments",), (0,)),                                          # the columns a padded side holds too
    ("SELECT o.amount, max(c.segment) AS s FROM customers c RIGHT JOIN orders o ON o.cust = c.cust "
     "GROUP BY o.amount", {"orders": ("amount",)}, ("customers",), (0,)),    # the right side kept
    ("SELECT c.segment, o.amount, max(p.paid) AS m FROM customers c LEFT JOIN orders o ON o.cust = c.cust "
     "JOIN payments p ON p.cust = c.cust GROUP BY c.segment, o.amount",
     {"customers": ("segment",)}, ("orders", "payments"), (0,)),             # a padded source's group: not held
    ("SELECT c.segment, max(o.amount) AS m FROM orders o LEFT JOIN customers c ON o.cust = c.cust "
     "GROUP BY c.segment", None, None, None),                                # only the padded side holds the groups
    ("SELECT c.segment, max(o.amount) AS m FROM customers c FULL JOIN orders o ON o.cust = c.cust "
     "GROUP BY c.segment", None, None, None),                                # a full outer join pads both
], ids=["segment-max", "paid-max", "by-order-having", "held-by-two", "each-by-one", "one-holds-both", "computed",
        "rand", "float-sum", "non-equi", "no-group-by", "self", "segment-left", "segment-left-left", "segment-anti",
        "cust-left-left", "repeated-whole", "held-with-padded", "right", "padded-group", "padded-side-holds", "full"])
def test_which_queries_are_aggregates_of_inner_joins(spark, unchanged_sources, held_rows, sql, keys, whole, grouping):
    """Over rows held in Spark, each source read once, as a view checks it (and over the sources
    first): the grouping columns the sources that hold them restrict by (those the most sources
    hold), those sources with their columns, and the sources read whole."""
    over_sources, shape, _ = _shapes(spark, unchanged_sources, held_rows, sql, per_group)
    assert shape == (PerGroup(keys, whole, grouping) if keys else None)
    if keys is not None:  # the shape checked over the sources first (which leaf is which source only after)
        assert over_sources is not None and shape.strategy == "per-group recompute"


@pytest.mark.parametrize("sql, key, without_feed, linear", [
    (SEGMENT_MAX, ("segment",), ("customers",), False),
    (PAID_MAX, ("cust",), ("payments",), False),
    (BY_ORDER, ("id",), ("orders",), False),
    ("SELECT o.id, c.segment, max(p.paid) AS m, count(DISTINCT p.cust) AS payers FROM orders o JOIN customers c "
     "ON o.cust = c.cust JOIN payments p ON p.paid = o.amount GROUP BY o.id, c.segment", (), (), False),
    (f"SELECT paid, count(*) AS n, sum(kinds) AS k FROM ({PAID_MAX}) GROUP BY paid", ("paid",), (), True),
    (SEGMENT_LEFT, ("segment",), ("orders",), False),
    (SEGMENT_LEFT_LEFT, ("segment",), ("payments",), False),
    (SEGMENT_ANTI, ("segment",), (), False),
    (CUST_LEFT_LEFT, (), ("customers",), False),
    (BY_CUST_IN_HAVING, ("cust",), ("orders",), False),
    ("SELECT a.cust, max(b.amount) AS m, count(*) AS n FROM orders a JOIN orders b ON b.cust = a.id GROUP BY a.cust",
     ("cust",), (), False),                                                  # orders read twice, the second whole
], ids=["segment-max-customers-no-feed", "paid-max-payments-no-feed", "by-order-having-orders-no-feed",
        "by-order-and-segment", "linear-over-it", "segment-left-orders-no-feed", "segment-left-left-payments-no-feed",
        "segment-anti", "cust-left-left-customers-no-feed", "in-grouped-having-orders-twice-no-feed",
        "self-join"])
def test_aggregates_of_inner_joins_equal_the_full_evaluation_at_every_time(spark, tmp_path, strategies, sql, key,
                                                                           without_feed, linear):
    """Random commits to orders, customers and payments (duplicates, null keys, orders moving
    customer, customers moving segment, deletes on several sides in one time, a row deleted and
    inserted again, groups appearing and emptying), a source without change data feed, (for one
    query of each strategy) a replica catching up over every time at once: at every time the view
    equals the full evaluation, and every range recomputed the changed groups (the whole sources' found by joining their changes),
    or moved the linear aggregate over them by those."""
    rng = random.Random(43)
    sources = _sources(spark, tmp_path, rng)
    edit = _random_commits(spark, sources, rng, without_feed, orders=0.6)
    late = linear or sql in (SEGMENT_LEFT, BY_CUST_IN_HAVING)
    view = maintained_against_the_query(spark, tmp_path, sources, sql, edit, rounds=4, rng=rng, key=key, late=late)
    desired = view.desired
    assert desired.per_group is not None and desired.per_group.whole and desired._previous is None
    assert strategies and set(strategies) == {"linear aggregate of per-group recompute" if linear
                                              else "per-group recompute"}, strategies
    assert "aggregate of a join grouped by columns of its sources" in desired.strategy_description()
    assert f"{', '.join(desired.per_group.whole)} read whole" in desired.strategy_description()


def test_a_source_read_whole_at_every_read_is_evaluated_in_full(spark, tmp_path, strategies):
    """TPC-H Q21's shape: an aggregate of a join whose groups are in none of orders' three reads.
    A per-group recompute would join each read's change with the other sources and read each read
    whole before and after, more than the query reads: it is evaluated in full, says why, and is
    right at every time."""
    rng = random.Random(41)
    sources = _sources(spark, tmp_path, rng)
    edit = _random_commits(spark, sources, rng, (), orders=0.8)
    with pytest.raises(ConfigError, match="refresh incremental, but .* orders read 3 times"):
        MaterializedView(spark, ViewDefinition("refused", str(tmp_path / "refused"), SnapshotInput(
            sql=MATCHED_NOT_OUTBID, refresh="incremental"), sources=sources, replica_id="r1"))
    view = maintained_against_the_query(spark, tmp_path, sources, MATCHED_NOT_OUTBID, edit, rounds=2, rng=rng,
                                        key=("segment",), refresh="auto")
    assert view.desired.per_group is None and view.desired.aggregate is None
    assert ("evaluated in full at each time (orders read 3 times, the groups in none of its reads: a per-group "
            "recompute would read it whole 6 times a step)") in view.desired.strategy_description()
    assert strategies and set(strategies) == {"full evaluation"}, strategies


#: Rollups: a linear aggregate of a linear aggregate, over an inner join and over one source.
ROLLUP = ("SELECT segment, sum(total) AS total, count(*) AS custs, sum(n) AS n FROM (SELECT c.cust, c.segment, "
          "sum(o.amount) AS total, count(*) AS n FROM orders o JOIN customers c ON o.cust = c.cust "
          "GROUP BY c.cust, c.segment) GROUP BY segment")
HISTOGRAM = "SELECT n, count(*) AS custs FROM (SELECT cust, count(*) AS n FROM orders GROUP BY cust) GROUP BY n"


@pytest.mark.parametrize("sql, rollup", [
    (ROLLUP, True),
    (HISTOGRAM, True),
    ("SELECT segment, sum(total * 2) AS t FROM (SELECT c.segment, sum(o.amount) AS total FROM orders o "
     "JOIN customers c ON o.cust = c.cust GROUP BY c.cust, c.segment) GROUP BY segment", False),  # an expression above
    ("SELECT n, count(*) AS k FROM (SELECT cust, sum(CAST(amount AS DOUBLE)) AS n FROM orders GROUP BY cust) "
     "GROUP BY n", False),                                                   # a float sum below
    (BY_ORDER_COUNT, False),                                                 # a left join's count(*) below
], ids=["rollup", "histogram", "expression-above", "float-sum-below", "left-join-below"])
def test_which_queries_are_rollups(spark, tmp_path, unchanged_sources, sql, rollup):
    """A linear aggregate of a linear aggregate, as the view takes it: rollups only, and preferred
    to recomputing the groups below (the histogram's is an aggregate of one source too)."""
    view = MaterializedView(spark, ViewDefinition("v", str(tmp_path / "v"), SnapshotInput(sql=sql),
                                                  sources=unchanged_sources, replica_id="r1"))
    for name, path in unchanged_sources.items():
        spark.read.format("delta").load(path).createOrReplaceTempView(name)
    assert (aggregate_of_aggregate(spark.sql(sql), TABLE_SCAN, len(view.desired.read))[1] is not None) == rollup
    assert (view.desired.below is not None) == rollup
    if rollup:
        assert view.desired.per_group is None and "a linear aggregate of a linear aggregate" in \
            view.desired.strategy_description()


@pytest.mark.parametrize("sql, key, without_feed, strategy", [
    (BY_ORDER_COUNT, ("n",), (), "per-key recompute"),
    (BY_SEGMENT, (), ("customers",), "per-key recompute"),  # a null segment: orders of no customer
    (BY_TOP, ("top",), ("orders",), "per-group recompute"),
    (ROLLUP, ("segment",), (), "linear aggregate"),
    (HISTOGRAM, ("n",), ("orders",), "linear aggregate"),
    (EXISTS_BY_SEGMENT, ("segment",), ("orders",), "per-key recompute"),  # TPC-H Q4's shape
    (BELOW_CUSTOMERS_AVERAGE, (), ("orders",), "per-key recompute"),  # TPC-H Q17's shape
], ids=["by-order-count", "by-segment-customers-no-feed", "by-top-orders-no-feed", "rollup-over-join",
        "histogram-orders-no-feed", "exists-by-segment-orders-no-feed", "below-average-orders-no-feed"])
def test_aggregates_of_aggregates_equal_the_full_evaluation_at_every_time(spark, tmp_path, strategies, sql, key,
                                                                          without_feed, strategy):
    """As the key joins' test above, for a linear aggregate over a per-key or per-group query
    (moved by its changed groups, recomputed; over a semi join by the changed keys, not the
    groups) and over a linear aggregate (moved by the rows the
    one below retracts and adds: groups below that appear and vanish, counts moving customers
    between the histogram's rows): at every time the view equals the full evaluation, every range
    moved the groups."""
    rng = random.Random(37)
    sources = {name: path for name, path in _sources(spark, tmp_path, rng).items() if name != "payments"}
    edit = _random_commits(spark, sources, rng, without_feed, orders=0.7)
    late = sql in (BY_SEGMENT, BY_TOP, HISTOGRAM)  # one over each strategy
    view = maintained_against_the_query(spark, tmp_path, sources, sql, edit, rounds=4, rng=rng, key=key, late=late)
    assert view.desired.aggregate is not None and view.desired._previous is None
    assert strategies and set(strategies) == {f"linear aggregate of {strategy}"}, strategies


def _edit_payments(spark, src: str, rng: random.Random) -> None:
    """One commit to payments: a payment made (null keys too), changed or dropped."""
    kind = rng.choice(["insert", "update", "delete"])
    if kind == "insert":
        insert(spark, src, [(rng.choice([*range(1, KEYS), None]), rng.randint(0, 4))])
    elif kind == "update":
        commit_sql(spark, f"UPDATE delta.`{src}` SET paid = paid + 1 WHERE cust = {rng.randint(1, KEYS)}")
    else:
        commit_sql(spark, f"DELETE FROM delta.`{src}` WHERE paid = {rng.randint(0, 4)}")


def _random_commits(spark, sources: dict[str, str], rng: random.Random, without_feed: tuple[str, ...],
                    orders: float) -> Callable[[], None]:
    """``sources`` (of :func:`_sources`) with the change data feed off on ``without_feed``, and a
    function making 0-3 random commits to them: to orders with chance ``orders``, to customers
    with 0.5, to payments (where it is one of them) with 0.4."""
    for name in without_feed:
        spark.sql(f"ALTER TABLE delta.`{sources[name]}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    next_id = [100]

    def edit() -> None:
        if rng.random() < orders:
            edit_orders(spark, sources["orders"], rng, next_id, KEYS)
        if rng.random() < 0.5:
            edit_customers(spark, sources["customers"], rng, KEYS)
        if "payments" in sources and rng.random() < 0.4:
            _edit_payments(spark, sources["payments"], rng)
    return edit


@pytest.mark.parametrize("sql, without_feed", [
    (LEFT, (),),
    (FULL, ("customers",),),
    (ANTI, (),),
    (AGGREGATE, ("orders",),),
    (THREE, ("payments",),),
    (OVER_AGGREGATE, ()),
], ids=["left", "full-customers-no-feed", "anti", "aggregate-orders-no-feed", "three-payments-no-feed",
        "over-aggregate"])
def test_key_join_changes_equal_the_full_evaluation_at_every_time(spark, tmp_path, strategies, sql, without_feed):
    """1-3 commits to any of the sources per time (duplicates, null keys, rows moving to another
    key, deletes on several sides in one time, a row deleted and inserted again), a source without
    change data feed (its commits' files), (for the full and the three-way join) a replica
    catching up over every time at once: at every time the view equals the full evaluation, and
    every range was recomputed per key."""
    rng = random.Random(31)
    sources = _sources(spark, tmp_path, rng)
    edit = _random_commits(spark, sources, rng, without_feed, orders=0.6)
    late = sql in (FULL, THREE)
    view = maintained_against_the_query(spark, tmp_path, sources, sql, edit, rounds=4, rng=rng, late=late)
    assert view.desired.per_group is not None and view.desired._previous is None
    assert strategies and set(strategies) == {STRATEGY}, strategies


def test_a_step_reads_only_the_changed_keys_files(spark, tmp_path):
    """Customers laid out in 8 files by key: a change of orders of two customers reads the
    customers' file holding them (once: their version does not move), and at each version only
    the orders' files holding those keys."""
    orders, customers = str(tmp_path / "orders"), str(tmp_path / "customers")
    create_source(spark, orders, schema=ORDERS)
    create_source(spark, customers, schema=CUSTOMERS)
    (spark.createDataFrame([(c, "xyz"[c % 3]) for c in range(1, 81)], CUSTOMERS).repartitionByRange(8, "cust")
     .write.format("delta").mode("append").save(customers))
    (spark.createDataFrame([(i, i % 80 + 1, i % 5) for i in range(400)], ORDERS).repartitionByRange(4, "cust")
     .write.format("delta").mode("append").save(orders))
    view = MaterializedView(spark, ViewDefinition("v", str(tmp_path / "v"),
                                                  SnapshotInput(sql=LEFT, refresh="incremental"),
                                                  key=("id",),
                                                  sources={"orders": orders, "customers": customers},
                                                  replica_id="r1"))
    view.run_until_caught_up()
    insert(spark, orders, [(1000, 79, 9), (1001, 80, 9)])
    reports = [view.step() for _ in range(3)]
    assert {r.strategy for r in reports if r.reads} == {STRATEGY}
    reads = sorted((r.table, r.files, r.total_files) for report in reports for r in report.reads)
    # customers' version is the same before and after: one read serves both
    assert [(files, total) for table, files, total in reads if table == "customers"] == [(1, 8)], reads
    (before, after) = sorted((files, total) for table, files, total in reads if table == "orders")
    assert before == (1, 4) and after[0] - (after[1] - 4) == 1, "orders: the last of the 4 old files (and the insert's)"


def test_the_files_both_versions_share_are_scanned_once(spark, tmp_path, monkeypatch):
    """A per-key step's one job reads each file once: the orders' files the versions before and
    after the change share (and the customers', whose version does not move) are scanned by one
    scan of the job's plan, reused by the other version's, not by one per version."""
    sources = {name: str(tmp_path / name) for name in ("orders", "customers")}
    create_source(spark, sources["orders"], [(i, i % 6 + 1, i % 5) for i in range(24)], ORDERS)
    insert(spark, sources["orders"], [(100 + i, i % 6 + 1, 1) for i in range(6)])  # a second file
    create_source(spark, sources["customers"], [(c, "xyz"[c % 3]) for c in range(1, 7)], CUSTOMERS)
    view = MaterializedView(spark, ViewDefinition("v", str(tmp_path / "v"), SnapshotInput(sql=LEFT, refresh="incremental"),
                                                  key=("id",), sources=sources, replica_id="r1"))
    view.run_until_caught_up()
    plans, held_observing = [], changes_module.held_observing

    def observed(frame, name, *metrics, keep=None, executed=None):
        executed = [] if executed is None else executed
        result = held_observing(frame, name, *metrics, keep=keep, executed=executed)
        if name == changes_module._OBSERVED:  # the job holding the step's changes (not a feed's)
            plans.append(executed[-1]._jdf.queryExecution().executedPlan())
        return result
    monkeypatch.setattr(changes_module, "held_observing", observed)
    insert(spark, sources["orders"], [(1000, 3, 9)])
    reports = [view.step() for _ in range(3)]
    assert {r.strategy for r in reports if r.reads} == {STRATEGY} and len(plans) == 1
    scans = [files for plan in plans for files in _scanned_files(plan)]
    scanned = [f for files in scans for f in files]
    assert any("orders" in f for f in scanned) and any("customers" in f for f in scanned), scans
    assert len(scanned) == len(set(scanned)), f"a file scanned twice: {scans}"


def _scanned_files(plan) -> list[list[str]]:
    """The files of each Parquet scan in an executed Spark ``plan`` (a reused exchange's scans,
    run once, are not under it again)."""
    kind = plan.getClass().getSimpleName()
    if kind == "AdaptiveSparkPlanExec":
        return _scanned_files(plan.executedPlan())
    if kind.endswith("QueryStageExec"):
        return _scanned_files(plan.plan())
    if kind == "FileSourceScanExec":
        return [list(plan.relation().location().inputFiles())]
    children = plan.children()
    return [files for i in range(children.size()) for files in _scanned_files(children.apply(i))]


def test_refresh_policies_explain_and_the_inner_join_keeping_its_strategy(spark, tmp_path, unchanged_sources,
                                                                            capsys):
    """``incremental`` takes a key join and still refuses a non-equi outer join on top (naming it);
    ``full`` evaluates it in full; an inner join keeps the join strategy; ``mvsink explain``
    prints the strategy and the keys."""
    from mvsink.replica import cli

    sources = unchanged_sources

    def view(sql: str, refresh: str) -> MaterializedView:
        return MaterializedView(spark, ViewDefinition("v", str(tmp_path / refresh), SnapshotInput(
            sql=sql, refresh=refresh), sources=sources, replica_id="r1"))

    assert view(THREE, "incremental").desired.per_group == PerGroup({**BY_CUST, "payments": ("cust",)})
    assert view(THREE, "full").desired.per_group is None
    inner = view("SELECT o.id, c.segment, p.paid FROM orders o JOIN customers c ON o.cust = c.cust "
                 "JOIN payments p ON p.cust = c.cust", "auto").desired
    assert inner.join and inner.per_group is None
    with pytest.raises(ConfigError, match="refresh incremental.*a LeftOuter Join with no key"):
        view("SELECT o.id, c.segment FROM orders o LEFT JOIN customers c ON o.cust < c.cust", "incremental")
    # joined with another source, the operators take it (the outer join recomputed whole where it sits)
    assert "Join (recomputed whole)" in view("SELECT o.id, c.segment, p.paid FROM orders o LEFT JOIN customers c "
                                             "ON o.cust < c.cust, payments p", "incremental").desired.strategy_description()
    config = tmp_path / "view.yaml"
    config.write_text(f"view_id: v\ntarget: target\nsources: {sources}\n"
                      f"input:\n  kind: snapshot\n  refresh: incremental\n  sql: \"{LEFT} WHERE o.id > 0\"\n")
    code = cli.main(["explain", str(config)])
    out = capsys.readouterr().out
    assert code == 0 and "its query joins its sources by a key that every join equates" in out, out
    assert "orders.(cust)" in out and "customers.(cust)" in out, out


@pytest.mark.parametrize("sql", [
    LEFT,
    "SELECT c.segment, count(*) AS n, sum(o.amount) AS total FROM orders o JOIN customers c ON o.cust = c.cust "
    "GROUP BY c.segment",
], ids=["key-join", "aggregate-over-join"])
def test_refresh_auto_switching_to_full_evaluation_and_back_stays_exact(spark, tmp_path, strategies, monkeypatch, sql):
    """``auto`` taking full evaluation at some steps and the maintained strategy at others (chosen at
    random here, by cost in a real run): a step after full evaluation starts from the sources (or
    the groups' state) again, a full evaluation after maintained steps from the result before it
    (the aggregate's: its groups' state, not evaluated again); at every time the view equals the
    full evaluation."""
    from mvsink.desired import snapshot
    from mvsink.desired.refresh import AutoRefresh, Fallback

    choice = random.Random(7)
    monkeypatch.setattr(AutoRefresh, "full_instead", lambda self, size, times: (
        Fallback("cost", "chosen at random") if choice.random() < 0.5 else None))
    evaluated, result_at = [], snapshot.SnapshotDesired._result_at
    monkeypatch.setattr(snapshot.SnapshotDesired, "_result_at", lambda self, time: (
        evaluated.append(time) if self.view.view_id == "maintained" else None, result_at(self, time))[1])
    before_ranges, changes = [], snapshot.SnapshotDesired.changes

    def recorded(self, lo, hi):
        del evaluated[:]
        computed = changes(self, lo, hi)
        if computed is not None and computed.strategy == "full evaluation" and self.view.view_id == "maintained":
            before_ranges.append(min(evaluated) < lo)  # the time before the range evaluated too
        return computed

    monkeypatch.setattr(snapshot.SnapshotDesired, "changes", recorded)
    rng = random.Random(41)
    sources = {name: path for name, path in _sources(spark, tmp_path, rng).items() if name != "payments"}
    next_id = [100]

    def edit() -> None:
        edit_orders(spark, sources["orders"], rng, next_id, KEYS)
        if rng.random() < 0.5:
            edit_customers(spark, sources["customers"], rng, KEYS)

    maintained_against_the_query(spark, tmp_path, sources, sql, edit, rounds=6, rng=rng, refresh="auto")
    assert {"full evaluation"} < set(strategies), strategies
    assert any(before_ranges) == (sql == LEFT), before_ranges  # the key join keeps no result to start from
