"""Linear aggregates under a top (:mod:`mvsink.desired.aggregate_top`): expressions of their
aggregates and ``HAVING``. Which queries are, over a join, one source, a rollup and a per-key
query; that their changes (the top over the rows the state retracts and adds) equal the full
evaluation at every time over random commits to both sources; and what a view explains."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from helpers import create_source, edit_customers, edit_orders, maintained_against_the_query
from mvsink import MaterializedView, SnapshotInput, ViewDefinition
from mvsink.desired.aggregate_top import RowWiseTop, aggregate_core

ORDERS, CUSTOMERS = "id BIGINT, cust BIGINT, amount INT", "cust BIGINT, segment STRING"
JOINED = "FROM orders o JOIN customers c ON o.cust = c.cust"
#: HAVING over a join's aggregate: segments enter and leave the view as their counts cross 3.
HAVING = f"SELECT c.segment, count(*) AS n, sum(o.amount) AS total {JOINED} GROUP BY c.segment HAVING count(*) > 3"
#: Expressions of aggregates over one source, a mean by division (a double), nulls coalesced.
EXPRESSIONS = ("SELECT cust AS customer, sum(amount) * 2 AS twice, sum(amount) / count(*) AS mean, "
               "coalesce(sum(amount), 0) + count(id) AS mixed FROM orders GROUP BY cust")
#: No grouping column kept: distinct groups can have the same row, and a group's row before and
#: after can be the same (a retraction and an addition that cancel).
UNKEYED = "SELECT sum(amount) > 6 AS big, count(*) > 2 AS many FROM orders GROUP BY cust"
#: A rollup under HAVING, and Q13's shape (a count of a left join's groups, a rollup over an
#: outer join) under HAVING.
ROLLUP = (f"SELECT segment, sum(total) / count(*) AS mean FROM (SELECT c.segment, c.cust, sum(o.amount) AS total "
          f"{JOINED} GROUP BY c.cust, c.segment) GROUP BY segment HAVING count(*) > 1")
#: A rollup whose aggregate below has a top: the big customers per segment (HAVING below and
#: above: the segments with fewer than 3). Sums of an expression of the sums below, under HAVING:
#: not a rollup (the one above computes), but a linear aggregate over a key join (by its key).
BIG_CUSTOMERS = (f"SELECT segment, count(*) AS big FROM (SELECT c.segment, c.cust, sum(o.amount) AS total {JOINED} "
                 "GROUP BY c.cust, c.segment HAVING sum(o.amount) > 5) GROUP BY segment HAVING count(*) < 3")
DOUBLED = (f"SELECT segment, sum(total * 2) AS doubled FROM (SELECT c.segment, c.cust, sum(o.amount) AS total {JOINED} "
           "GROUP BY c.cust, c.segment) GROUP BY segment HAVING sum(total * 2) > 0")
OF_GROUPS = ("SELECT n, count(*) AS custs FROM (SELECT c.cust, count(o.id) AS n FROM customers c LEFT JOIN orders o "
             "ON c.cust = o.cust GROUP BY c.cust) GROUP BY n HAVING count(*) > 1")
#: No GROUP BY (TPC-H Q14's shape): one row, expressions of sums over a join (no rows at all:
#: test_linear_aggregate's no-group-by cases).
NO_GROUPS = (f"SELECT sum(CASE WHEN c.segment = 'x' THEN o.amount ELSE 0 END) * 100 AS x_share, count(*) AS n, "
             f"sum(o.amount) + 1 AS total {JOINED} WHERE o.amount > 2")


def _sources(spark, tmp_path, rng: random.Random) -> dict[str, str]:
    """Orders of customers 1-4 (and null), and customers (one twice, a null key)."""
    sources = {"orders": str(tmp_path / "orders"), "customers": str(tmp_path / "customers")}
    create_source(spark, sources["orders"], [(i, rng.choice([1, 2, 3, 4, None]), rng.randint(0, 5)) for i in range(24)],
                  ORDERS)
    create_source(spark, sources["customers"], [(1, "x"), (2, "y"), (2, "y"), (3, "z"), (4, "x"), (None, "x")],
                  CUSTOMERS)
    return sources


@pytest.fixture(scope="module")
def unchanged_sources(spark, tmp_path_factory) -> dict[str, str]:
    return _sources(spark, tmp_path_factory.mktemp("top_sources"), random.Random(0))


LINEAR, ROLLUP_OF, OF_KEYS, FULL = ("linear aggregate", "linear aggregate of linear aggregate",
                                  "linear aggregate of per-key recompute", "full evaluation")


@pytest.mark.parametrize("sql, strategy, tops, keyed", [
    (HAVING, LINEAR, "above", True),
    (EXPRESSIONS, LINEAR, "above", True),                                    # the group renamed
    (UNKEYED, LINEAR, "above", False),
    ("SELECT cust, count(*) AS n FROM orders GROUP BY cust HAVING sum(amount) > 4", LINEAR, "above", True),
    (f"SELECT c.segment AS seg, count(*) AS n {JOINED} GROUP BY c.segment, o.amount HAVING count(*) > 1", LINEAR,
     "above", False),                                                        # part of the groups
    (ROLLUP, ROLLUP_OF, "above", True),
    (BIG_CUSTOMERS, ROLLUP_OF, "both", True),
    (DOUBLED, OF_KEYS, "above", True),
    (OF_GROUPS, ROLLUP_OF, "above", True),
    (NO_GROUPS, LINEAR, "above", True),                                     # one row: keyed by anything
    (f"SELECT c.segment, count(*) AS n {JOINED} GROUP BY c.segment HAVING max(o.amount) > 3", FULL, None, None),
    (f"SELECT c.segment, count(*) * rand() AS n {JOINED} GROUP BY c.segment", FULL, None, None),
    (f"SELECT c.segment, sum(CAST(o.amount AS DOUBLE)) * 2 AS s {JOINED} GROUP BY c.segment", FULL, None, None),
    (f"SELECT c.segment, count(*) AS n {JOINED} GROUP BY c.segment HAVING count(*) > (SELECT count(*) FROM customers)",
     FULL, None, None),                                                      # a subquery
    (f"SELECT c.segment, count(*) AS n {JOINED} GROUP BY c.segment", LINEAR, None, None),  # no top
], ids=["having-join", "expressions", "unkeyed", "having-one-source", "part-of-groups", "rollup", "big-customers",
        "doubled", "of-groups", "no-groups", "max", "rand", "float-sum", "subquery", "no-top"])
def test_which_queries_are_linear_aggregates_under_a_top(spark, tmp_path, unchanged_sources, sql, strategy, tops,
                                                         keyed):
    """As a view takes it (over the sources, then over rows held): a linear aggregate with a top
    (``above``), over a join, one source (preferred to recomputing its groups), a linear aggregate
    (whose own aggregate can have a top: ``below``), a key join; what has an aggregate that is not
    linear, a non-deterministic top, a float sum or a subquery is not; a plain aggregate has no
    top. The top of the query over its core's rows is the query, and its first column holds every
    group (``keyed``: the key check can be skipped) or not."""
    view = MaterializedView(spark, ViewDefinition("v", str(tmp_path / "v"), SnapshotInput(sql=sql),
                                                  sources=unchanged_sources, replica_id="r1"))
    desired = view.desired
    assert (desired._aggregate_strategy if desired.aggregate is not None else FULL) == strategy
    assert (desired._top is not None, desired._below_top is not None) == (tops in ("above", "both"),
                                                                          tops in ("below", "both"))
    if desired._top is not None:
        assert "filters above them (HAVING)" in desired.strategy_description()
        for name, path in unchanged_sources.items():
            spark.read.format("delta").load(path).createOrReplaceTempView(name)
        query = spark.sql(sql)
        over_core = RowWiseTop(query).over(aggregate_core(query))
        assert Counter(over_core.collect()) == Counter(query.collect()) and over_core.schema.names == query.schema.names
        assert RowWiseTop(query).groups_are_keyed(tuple(query.columns[:1])) is keyed
    if desired._below_top is not None:
        assert "(under its expressions and HAVING)" in desired.strategy_description()


@pytest.mark.parametrize("sql, key, without_feed, strategy", [
    (HAVING, ("segment",), (), "linear aggregate"),
    (EXPRESSIONS, (), ("orders",), "linear aggregate"),  # a null customer: no key
    (UNKEYED, (), (), "linear aggregate"),
    (ROLLUP, ("segment",), ("customers",), "linear aggregate of linear aggregate"),
    (BIG_CUSTOMERS, ("segment",), ("orders",), "linear aggregate of linear aggregate"),
    (OF_GROUPS, ("n",), (), "linear aggregate of linear aggregate"),
    (NO_GROUPS, (), ("customers",), "linear aggregate"),
], ids=["having-join", "expressions-no-feed", "unkeyed", "rollup-customers-no-feed", "big-customers-orders-no-feed",
        "of-groups", "no-groups-customers-no-feed"])
def test_aggregates_under_a_top_equal_the_full_evaluation_at_every_time(spark, tmp_path, strategies, sql, key,
                                                                         without_feed, strategy):
    """The view maintained beside the view evaluated in full, over random commits to orders and
    customers (duplicates, null keys, rows moving customer, customers moving segment, deletes, a
    row deleted and inserted again): groups cross the HAVING both ways, rows of distinct groups
    coincide, a group's row before and after can be the same. A late replica catches up over
    every time at once (under expressions, and over a rollup). At every time both have the same
    rows, and every range kept the state."""
    rng = random.Random(41)
    sources = _sources(spark, tmp_path, rng)
    for name in without_feed:
        spark.sql(f"ALTER TABLE delta.`{sources[name]}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    next_id = [100]

    def edit() -> None:
        if rng.random() < 0.7:
            edit_orders(spark, sources["orders"], rng, next_id)
        if rng.random() < 0.5:
            edit_customers(spark, sources["customers"], rng)

    view = maintained_against_the_query(spark, tmp_path, sources, sql, edit, rounds=5, rng=rng, key=key,
                                        late=sql in (EXPRESSIONS, ROLLUP))
    assert (view.desired._top or view.desired._below_top) is not None and view.desired._previous is None
    assert strategies and set(strategies) == {strategy}, strategies
