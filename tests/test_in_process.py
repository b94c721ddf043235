"""A join's change terms computed in this process (:mod:`mvsink.desired.in_process`,
:mod:`mvsink.desired.arrow_plan`): the plan's translation against Spark's own evaluation, the
view against the query at every time, and the steps left to Spark."""

from __future__ import annotations

import datetime
import logging
import random
from collections import Counter
from decimal import Context, Decimal

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from helpers import (commit_sql, create_source, edit_customers, edit_orders, insert, maintained_against_the_query,
                     query_over_a_source)
from mvsink.desired import in_process, snapshot
from mvsink.desired.in_process import local_relation
from mvsink.desired.arrow_groups import arrow_groups
from mvsink.desired.arrow_plan import ArrowPlan, NotEvaluated, NotTranslated, arrow_schema
from mvsink.desired.linear_aggregate import LinearAggregate, Output, linear_aggregate
from mvsink.desired.row_wise import TABLE_SCAN
from mvsink.updates import DIFF

ORDERS = "id BIGINT, cust BIGINT, amount INT, placed DATE"
CUSTOMERS = "cust BIGINT, segment STRING"
LINES = "order_id BIGINT, price DECIMAL(12,2), discount DECIMAL(4,2), shipped DATE"
#: Q3's shape: lines of orders of customers, filtered by dates, a segment list and a price, the
#: revenue an exact decimal expression.
REVENUE = ("SELECT l.order_id, c.segment, o.placed, sum(l.price * (1 - l.discount)) AS revenue, count(*) AS n, "
           "count(c.segment) AS segments FROM lines l JOIN orders o ON l.order_id = o.id "
           "JOIN customers c ON o.cust = c.cust "
           "WHERE o.placed < DATE '2024-01-05' AND l.shipped > DATE '2024-01-02' "
           "AND (c.segment IN ('x', 'y') OR c.segment IS NULL) AND l.price >= 1.50 "
           "GROUP BY l.order_id, c.segment, o.placed")


def _day(rng) -> datetime.date | None:
    return rng.choice([None, *(datetime.date(2024, 1, d) for d in range(1, 8))])


def _line(rng, orders: int) -> tuple:
    return (rng.choice([*range(orders), None]), rng.choice([None, Decimal(rng.randint(0, 999)) / 100]),
            Decimal(rng.randint(0, 10)) / 100, _day(rng))


def _sources(spark, tmp_path, rng, lines_feed: bool = True) -> dict[str, str]:
    """Orders, customers and lines, with duplicates, null keys and null values; the lines' change
    data feed off where not ``lines_feed`` (their changes then read from added and removed files)."""
    sources = {name: str(tmp_path / name) for name in ("customers", "orders", "lines")}
    create_source(spark, sources["orders"], [(i, rng.choice([1, 2, 3, None]), rng.randint(0, 5), _day(rng))
                                             for i in range(20)], ORDERS)
    create_source(spark, sources["customers"], [(1, "x"), (2, "y"), (2, "y"), (3, "z"), (None, "x"), (4, None)],
                  CUSTOMERS)
    create_source(spark, sources["lines"], [_line(rng, 20) for _ in range(30)], LINES)
    if not lines_feed:
        spark.sql(f"ALTER TABLE delta.`{sources['lines']}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    return sources


def _edit_lines(spark, path: str, rng) -> None:
    """One commit to lines: added (duplicates, null orders), deleted, moved to another order."""
    kind = rng.choice(["insert", "delete", "move", "duplicate"])
    if kind == "insert":
        insert(spark, path, [_line(rng, 30) for _ in range(rng.randint(1, 3))])
    elif kind == "delete":
        commit_sql(spark, f"DELETE FROM delta.`{path}` WHERE pmod(order_id, 5) = {rng.randint(0, 4)}")
    elif kind == "move":
        commit_sql(spark, f"UPDATE delta.`{path}` SET order_id = {rng.randint(0, 30)} "
                          f"WHERE shipped = DATE '2024-01-0{rng.randint(1, 7)}'")
    else:
        spark.sql(f"INSERT INTO delta.`{path}` SELECT * FROM delta.`{path}` WHERE order_id = {rng.randint(0, 20)}")


def _edit_orders(spark, path: str, rng, next_id: list[int]) -> None:
    """One commit to orders: the helpers' (inserted with null customers and a duplicate, moved to
    another customer, deleted, deleted and inserted again in one commit), or moved to another date."""
    if rng.random() < 0.2:
        commit_sql(spark, f"UPDATE delta.`{path}` SET placed = DATE '2024-01-0{rng.randint(1, 7)}' "
                          f"WHERE pmod(id, 4) = {rng.randint(0, 3)}")
    else:
        edit_orders(spark, path, rng, next_id, more=lambda: (_day(rng),))


#: The join under Q3's shape, each line's revenue (no aggregate: the inner join's own terms).
LINE_REVENUE = ("SELECT l.order_id, l.price * (1 - l.discount) AS revenue, o.placed, c.segment FROM lines l "
                "JOIN orders o ON l.order_id = o.id JOIN customers c ON o.cust = c.cust "
                "WHERE o.placed < DATE '2024-01-05' AND (c.segment IN ('x', 'y') OR c.segment IS NULL)")


#: Without ``GROUP BY``: one row always, its sums of integers (kept as decimals, output as longs)
#: and decimals null over no rows.
TOTALS = ("SELECT sum(o.amount) AS amount, sum(l.price) AS price, count(l.discount) AS discounts, count(*) AS n "
          "FROM lines l JOIN orders o ON l.order_id = o.id WHERE o.placed < DATE '2024-01-05'")


#: Averages over Q3's join: of a decimal expression and a decimal (Spark's decimal division) and of
#: an integer (a division of doubles), moved with the groups' state.
AVERAGES = ("SELECT c.segment, o.placed, avg(l.price * (1 - l.discount)) AS revenue, avg(l.price) AS price, "
            "avg(o.amount) AS amount, count(*) AS n FROM lines l JOIN orders o ON l.order_id = o.id "
            "JOIN customers c ON o.cust = c.cust WHERE o.placed < DATE '2024-01-05' GROUP BY c.segment, o.placed")


#: Q3's join with aggregates that are not linear, per order and date: a largest decimal expression, a
#: first date, a greatest string, distinct discounts (its changed groups recomputed from its input
#: held here), with a sum, an average and a count.
EXTREMES = ("SELECT l.order_id, o.placed, max(l.price * (1 - l.discount)) AS top, min(l.shipped) AS first, "
            "max(c.segment) AS segment, count(DISTINCT l.discount) AS discounts, sum(l.price) AS price, "
            "avg(o.amount) AS amount, count(*) AS n FROM lines l JOIN orders o ON l.order_id = o.id "
            "JOIN customers c ON o.cust = c.cust WHERE o.placed < DATE '2024-01-05' GROUP BY l.order_id, o.placed")


@pytest.mark.parametrize("sql, key, lines_feed, here", [
    (REVENUE, ("order_id", "segment", "placed"), True, "terms and groups"),
    (AVERAGES, ("segment", "placed"), True, "terms and groups"),
    (EXTREMES, ("order_id", "placed"), True, "terms and groups"),
    (EXTREMES, ("order_id",), False, "terms and groups"),
    (REVENUE, ("order_id", "segment", "placed"), False, "terms and groups"),
    (REVENUE, ("order_id",), True, "terms and groups"),
    (TOTALS, (), True, "terms and groups"),
    (LINE_REVENUE, (), True, "terms")], ids=["aggregate-feed", "averages", "extremes", "extremes-order-key-no-feed",
                                            "aggregate-no-feed", "aggregate-order-key", "totals", "join"])
def test_terms_in_process_keep_the_view_equal_to_the_query_at_every_time(spark, tmp_path, changes_computed,
                                                                         sql, key, lines_feed, here):
    """Q3's shape, its averages, its join alone, and an aggregate without ``GROUP BY``, over random commits
    (duplicate rows, null keys and values, rows changing their join partner, deletes on both
    sides in one time, a row deleted and inserted again, 1-3 commits per time, groups that appear
    and empty), the lines with or without their change data feed: at every time the view has the
    query's rows and key errors, and its steps' terms were computed in process, and an aggregate's
    groups' state moved there (:mod:`mvsink.desired.arrow_groups`; without the lines' feed, and
    for the join, a late replica's one step over every time too). Keyed by the order alone, an order's duplicates with other customers are
    groups of one key: key violations start and end, and the key check runs where they may."""
    rng = random.Random((41 if lines_feed else 43) + len(key) + len(sql))
    sources = _sources(spark, tmp_path, rng, lines_feed)
    next_id = [100]

    def edit() -> None:
        if key == ("order_id",) and rng.random() < 0.3:  # an order twice, on another date: two groups of one key
            shipped = sorted(r[0] for r in spark.sql(
                f"SELECT DISTINCT order_id FROM delta.`{sources['lines']}` "
                "WHERE shipped > DATE '2024-01-02' AND price >= 1.50 AND order_id IS NOT NULL").collect())
            spark.sql(f"INSERT INTO delta.`{sources['orders']}` SELECT id, cust, amount, DATE '2024-01-0{rng.randint(1, 4)}' "
                      f"FROM delta.`{sources['orders']}` WHERE id = {rng.choice(shipped or [0])} LIMIT 1")
        elif rng.random() < 0.6:
            _edit_orders(spark, sources["orders"], rng, next_id)
        if rng.random() < 0.7:
            _edit_lines(spark, sources["lines"], rng)

    view = maintained_against_the_query(spark, tmp_path, sources, sql, edit, rounds=7, rng=rng, key=key,
                                        late=not lines_feed or sql == LINE_REVENUE)
    assert (view.desired._recompute if sql == EXTREMES else view.desired._in_process) is not None
    assert changes_computed and all(c.in_process == here for c in changes_computed), [
        (c.strategy, c.in_process) for c in changes_computed]
    if key == ("order_id",):
        assert any(c.key_counts_change for c in changes_computed), "no step had a key violation start or end"
        assert not all(c.key_counts_change for c in changes_computed), "every step ran the key check"


#: Q3's shape with customers a dimension (read only by the join on their key, a filter and a
#: grouping column): while they change, the rest of the join is held (:mod:`mvsink.desired.dimension`).
BY_SEGMENT = REVENUE.replace(", count(c.segment) AS segments", "")
#: The same with aggregates that are not linear: its input's rows are held here, and while customers
#: change, the rest of the join's rows by the customer's key (:mod:`mvsink.desired.arrow_recompute`).
EXTREMES_BY_SEGMENT = REVENUE.replace(
    "sum(l.price * (1 - l.discount)) AS revenue, count(*) AS n, count(c.segment) AS segments",
    "max(l.price * (1 - l.discount)) AS top, min(l.shipped) AS first, count(DISTINCT l.discount) AS discounts, "
    "avg(o.amount) AS amount, count(*) AS n")
HELD_BY_SEGMENT = {BY_SEGMENT: "while customers changes too: the rest of the join held here",
                   EXTREMES_BY_SEGMENT: "while customers changes, the rest of the join's rows are held there"}


@pytest.mark.parametrize("sql, key, lines_feed, some_in_spark", [
    (BY_SEGMENT, ("order_id", "segment", "placed"), True, False), (BY_SEGMENT, ("order_id",), False, False),
    (BY_SEGMENT, ("order_id",), True, True), (EXTREMES_BY_SEGMENT, ("order_id",), True, False),
    (EXTREMES_BY_SEGMENT, ("order_id", "segment", "placed"), False, True)],
    ids=["groups-key", "order-key-no-feed", "some-steps-in-spark", "extremes", "extremes-no-feed-some-in-spark"])
def test_a_dimensions_steps_in_process_keep_the_view_equal_to_the_query_at_every_time(
        spark, tmp_path, changes_computed, monkeypatch, sql, key, lines_feed, some_in_spark):
    """Customers moving segment, duplicated, deleted and appearing with null keys, beside orders
    and lines changing (as above; some the moved customers' own), 1-3 commits per time: at every
    time the view has the query's rows and key errors, and every step ran in process, those where
    customers changed with the rest of the join held here (:mod:`mvsink.desired.arrow_dimension`;
    a late replica's one step over every time too): a linear aggregate's groups' state moved, or
    the changed groups of one with ``max``, ``min`` and ``count(DISTINCT)`` recomputed. Where some
    steps' changes are not small, those are Spark's, and the rest held passes between Spark and
    the driver (or is held again after them)."""
    from mvsink.desired.arrow_dimension import ArrowDimension

    if some_in_spark:
        _every_third_change_large(monkeypatch)

    steps = []
    step = ArrowDimension.step

    def counted(self, *args, **kwargs):
        steps.append(args[2])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(ArrowDimension, "step", counted)
    rng = random.Random(53 + len(key))
    sources = _sources(spark, tmp_path, rng, lines_feed)
    view = maintained_against_the_query(spark, tmp_path, sources, sql, _customers_moving(spark, sources, rng),
                                        rounds=7, rng=rng, key=key)
    assert HELD_BY_SEGMENT[sql] in view.desired.strategy_description()
    assert changes_computed and {c.in_process for c in changes_computed} == (
        {"", "terms and groups"} if some_in_spark else {"terms and groups"}), [
        (c.strategy, c.in_process) for c in changes_computed]
    assert len(steps) >= 3 and any(len(times) > 3 for times in steps), steps


def _every_third_change_large(monkeypatch) -> None:
    """Every third change a step reads in the driver is not small (its step is Spark's)."""
    small, calls = in_process.feed_is_small, [0]

    def every_third_large(path, first, last):
        calls[0] += 1
        return calls[0] % 3 != 0 and small(path, first, last)

    monkeypatch.setattr(in_process, "feed_is_small", every_third_large)


def _customers_moving(spark, sources: dict[str, str], rng):
    """An edit of one time: orders and lines changing (as above), customers duplicated, deleted and
    appearing with null keys, and a customer moving segment as its own orders change."""
    next_id = [100]

    def edit() -> None:
        if rng.random() < 0.5:
            _edit_orders(spark, sources["orders"], rng, next_id)
        if rng.random() < 0.5:
            _edit_lines(spark, sources["lines"], rng)
        if rng.random() < 0.7:
            edit_customers(spark, sources["customers"], rng, customers=4)
        if rng.random() < 0.4:  # a customer moves, and its orders change at the same time
            cust = rng.randint(1, 3)
            commit_sql(spark, f"UPDATE delta.`{sources['customers']}` SET segment = '{rng.choice('xy')}' "
                              f"WHERE cust = {cust}")
            commit_sql(spark, f"UPDATE delta.`{sources['orders']}` SET placed = DATE '2024-01-0{rng.randint(1, 4)}' "
                              f"WHERE cust = {cust}")

    return edit


def test_a_rest_too_large_to_hold_leaves_the_dimensions_changes_to_the_other_sources(
        spark, tmp_path, changes_computed, monkeypatch, caplog):
    """An aggregate recomputed from its input held here, over a join with a dimension whose rest
    of the join has more rows than are held: the dimension's changes meet the other sources (read
    here, every step still in process), logged, and the view equals the query at every time."""
    monkeypatch.setattr(snapshot, "MOST_REST_ROWS", 0)
    rng = random.Random(59)
    sources = _sources(spark, tmp_path, rng)
    with caplog.at_level(logging.INFO, logger="mvsink.desired.snapshot"):
        view = maintained_against_the_query(spark, tmp_path, sources, EXTREMES_BY_SEGMENT,
                                            _customers_moving(spark, sources, rng), rounds=5, rng=rng, key=("order_id",))
    assert view.desired._recompute is not None and view.desired._recompute_dimension is None
    assert {c.in_process for c in changes_computed} == {"terms and groups"}, [
        (c.strategy, c.in_process) for c in changes_computed]
    assert any("customers's changes meet the other sources: the rest of its join has more than 0 rows" in m
               for m in caplog.messages), caplog.messages


def test_a_step_spark_must_compute_is_computed_by_spark(spark, tmp_path, changes_computed, monkeypatch, caplog):
    """A change that is not small, and a source whose files hold deleted rows (deletion vectors),
    are Spark's steps: the view stays equal to the query at every time, and the steps say where
    their terms were computed."""
    rng = random.Random(47)
    sources = _sources(spark, tmp_path, rng)
    spark.sql(f"ALTER TABLE delta.`{sources['customers']}` SET TBLPROPERTIES (delta.enableDeletionVectors = true)")
    _every_third_change_large(monkeypatch)
    next_id = [100]

    def edit() -> None:
        _edit_orders(spark, sources["orders"], rng, next_id)
        if rng.random() < 0.3:
            commit_sql(spark, f"DELETE FROM delta.`{sources['customers']}` WHERE cust = {rng.randint(1, 4)}")

    with caplog.at_level(logging.INFO, logger="mvsink.desired.snapshot"):
        maintained_against_the_query(spark, tmp_path, sources, REVENUE, edit, rounds=6, rng=rng,
                                     key=("order_id", "segment", "placed"))
    assert changes_computed and {c.in_process for c in changes_computed} == {""}
    reasons = [m for m in caplog.messages if "are computed by Spark" in m and "'maintained'" in m]
    assert any("the change of source orders at versions" in m and "is not small" in m for m in reasons), reasons
    assert any("the files of source customers at version" in m and "not plain Parquet" in m for m in reasons), reasons


def test_groups_recomputed_in_spark_between_steps_here_keep_the_held_input_right(spark, tmp_path, changes_computed,
                                                                                 monkeypatch, caplog):
    """An aggregate whose changed groups are recomputed from its input held in the driver, with every
    third step's change not small (Spark recomputes its groups, and the input held is dropped): the
    next step here holds the input again at the time before it, and the view equals the query at
    every time, steps of both kinds among its steps."""
    rng = random.Random(53)
    sources = _sources(spark, tmp_path, rng)
    _every_third_change_large(monkeypatch)
    next_id = [100]

    def edit() -> None:
        _edit_orders(spark, sources["orders"], rng, next_id)
        if rng.random() < 0.7:
            _edit_lines(spark, sources["lines"], rng)

    with caplog.at_level(logging.INFO, logger="mvsink.desired.snapshot"):
        view = maintained_against_the_query(spark, tmp_path, sources, EXTREMES, edit, rounds=7, rng=rng,
                                            key=("order_id", "placed"))
    assert view.desired._recompute is not None
    assert {c.in_process for c in changes_computed} == {"", "terms and groups"}, [
        (c.strategy, c.in_process) for c in changes_computed]
    assert {c.strategy for c in changes_computed} == {"per-group recompute"}
    assert any("are recomputed by Spark" in m and "is not small" in m for m in caplog.messages)


def _held(spark, rows: dict[str, tuple[str, list[tuple]]]) -> dict[str, object]:
    """Each source's rows held in Spark, registered under its name."""
    held = {}
    for name, (schema, values) in rows.items():
        held[name] = spark.createDataFrame(values, schema).localCheckpoint(eager=True)
        held[name].createOrReplaceTempView(name)
    return held


def _table(schema, values: list[tuple]) -> pa.Table:
    """``values`` as an Arrow table of the Spark ``schema``'s types."""
    arrow = arrow_schema(schema)
    return pa.Table.from_pylist([dict(zip(arrow.names, row)) for row in values], schema=arrow)


ROWS = {
    "orders": (ORDERS, [(1, 1, 5, datetime.date(2024, 1, 1)), (2, None, 7, datetime.date(2024, 1, 3)),
                        (3, 2, None, None), (4, 3, 2147483647, datetime.date(2024, 1, 9)), (5, 1, -3, None)]),
    "lines": (LINES, [(1, Decimal("10.25"), Decimal("0.05"), datetime.date(2024, 1, 2)),
                      (1, Decimal("10.25"), Decimal("0.05"), datetime.date(2024, 1, 2)),
                      (2, None, Decimal("0.10"), datetime.date(2024, 1, 4)), (None, Decimal("3.00"), None, None),
                      (4, Decimal("9999999999.99"), Decimal("0.99"), datetime.date(2024, 1, 5))]),
    "customers": (CUSTOMERS, [(1, "x"), (1, "x"), (2, None), (3, "é"), (None, "y")]),
}


@pytest.mark.parametrize("sql", [
    "SELECT l.order_id, o.amount, c.segment FROM lines l JOIN orders o ON l.order_id = o.id "
    "JOIN customers c ON o.cust = c.cust",
    "SELECT o.id, c.segment FROM orders o JOIN customers c ON o.cust = c.cust AND o.amount > 4 "
    "WHERE c.segment IN ('x', 'é', NULL) OR NOT (o.placed >= DATE '2024-01-03')",
    "SELECT l.order_id, l.price * (1 - l.discount) AS revenue, l.price + o.amount AS plus, o.amount - 1 AS less "
    "FROM lines l JOIN orders o ON l.order_id = o.id WHERE l.price > 5 AND o.placed IS NOT NULL",
    "SELECT o.id, CAST(o.amount AS BIGINT) * 2 AS twice, CAST(o.amount AS DECIMAL(20, 2)) AS exact FROM orders o "
    "JOIN customers c ON o.cust = c.cust WHERE c.segment < 'y' OR c.segment IS NULL",
    "SELECT l.order_id, CAST(l.price AS DECIMAL(30, 2)) * (1 - l.discount) * (1 + l.discount) AS charge "
    "FROM lines l JOIN orders o ON l.order_id = o.id",
    "SELECT o.id, CASE WHEN c.segment LIKE 'x%' THEN o.amount WHEN o.placed IS NULL THEN -1 END AS a, "
    "CASE WHEN c.segment = 'y' THEN 1 ELSE 0 END AS b, coalesce(c.segment, 'none') AS s, "
    "if(o.amount > 3, 'big', NULL) AS size, c.segment LIKE '%é' AS ends, c.segment LIKE '_' AS one, "
    "c.segment LIKE '%x%' AS has FROM orders o JOIN customers c ON o.cust = c.cust",
    "SELECT o.id, year(o.placed) AS y, month(o.placed) AS m, day(o.placed) AS d FROM orders o "
    "JOIN customers c ON o.cust = c.cust WHERE year(o.placed) > 1000 OR o.placed IS NULL",
], ids=["joins", "in-or-not", "decimals", "casts", "wide-decimals", "conditions", "date-fields"])
def test_a_translated_plan_yields_sparks_rows(spark, sql):
    """Over rows with nulls, duplicates, a non-ASCII string and the largest values of their types:
    the plan evaluated in Arrow has the multiset of rows Spark's has, in its types."""
    held = _held(spark, ROWS)
    frame = spark.sql(sql)
    names = {rows._jdf.queryExecution().optimizedPlan().rdd().id(): name for name, rows in held.items()}
    plan = ArrowPlan(frame, names)
    got = plan.evaluate({name: _table(held[name].schema, ROWS[name][1]).select(columns)
                         for name, columns in plan.columns.items()})
    assert got.schema == plan.arrow_schema
    assert Counter(map(tuple, (r.values() for r in got.to_pylist()))) == Counter(tuple(r) for r in frame.collect())


@pytest.mark.parametrize("sql, reason", [
    ("SELECT l.order_id, l.price / 2 AS half FROM lines l JOIN orders o ON l.order_id = o.id", "Divide"),
    ("SELECT o.id, upper(c.segment) AS s FROM orders o JOIN customers c ON o.cust = c.cust", "Upper"),
    ("SELECT o.id FROM orders o JOIN customers c ON o.cust = c.cust WHERE c.segment LIKE 'x!%' ESCAPE '!'",
     "escape character"),
    ("SELECT o.id, c.segment FROM orders o LEFT JOIN customers c ON o.cust = c.cust", "node Join"),
    ("SELECT o.id, c.segment FROM orders o JOIN customers c ON o.cust < c.cust", "equality"),
    ("SELECT o.id, CAST(o.amount AS DOUBLE) AS d FROM orders o JOIN customers c ON o.cust = c.cust", "double"),
    ("SELECT l.order_id, l.price * l.price * l.price * l.price AS p FROM lines l JOIN orders o ON l.order_id = o.id",
     "rounded"),
    ("SELECT l.order_id, sum(l.price) AS total FROM lines l GROUP BY l.order_id", "node Aggregate"),
], ids=["divide", "function", "escape", "outer-join", "non-equi", "float", "rounded-decimal", "aggregate"])
def test_what_the_translation_refuses_it_names(spark, sql, reason):
    """Expressions, joins and types Arrow does not compute as Spark does are refused, named."""
    held = _held(spark, ROWS)
    names = {rows._jdf.queryExecution().optimizedPlan().rdd().id(): name for name, rows in held.items()}
    with pytest.raises(NotTranslated, match=reason):
        ArrowPlan(spark.sql(sql), names)


def test_an_overflow_is_left_to_spark(spark):
    """An integer sum past its type's range is not evaluated here (Spark decides: an error, or its value)."""
    held = _held(spark, ROWS)
    names = {rows._jdf.queryExecution().optimizedPlan().rdd().id(): name for name, rows in held.items()}
    plan = ArrowPlan(spark.sql("SELECT o.id, o.amount + 1 AS next FROM orders o JOIN customers c ON o.cust = c.cust"),
                     names)
    sources = {"orders": _table(held["orders"].schema, [(4, 3, 2147483647, None)]),
               "customers": _table(held["customers"].schema, [(3, "z")])}
    with pytest.raises(NotEvaluated):
        plan.evaluate({name: table.select(plan.columns[name]) for name, table in sources.items()})


def test_rows_reach_spark_whatever_their_record_batches(spark):
    """Terms' rows concatenated from parts, some empty, all reach Spark (PySpark's own conversion
    of such a table loses rows)."""
    one = pa.table({"a": pa.array([1, 2], pa.int64())})
    schema = T.StructType([T.StructField("a", T.LongType())])
    for parts in ([one.slice(0, 0), one.slice(0, 0), one], [one, one.slice(0, 0), one]):
        rows = pa.concat_tables(parts)
        assert local_relation(spark, rows, schema).count() == rows.num_rows


def test_groups_state_moved_here_fits_sparks_types_or_is_left_to_spark():
    """The groups' state moved in Arrow (:mod:`mvsink.desired.arrow_groups`): a group's sum
    retracted and added as Spark's types have it, null grouping values grouped together, a group
    emptied gone; a sum past the output's ``bigint`` is not evaluated here (Spark decides)."""
    aggregate = LinearAggregate(("g",), (Output("g", "group", "g"), Output("s", "sum", "v", kept_as="decimal(38,0)"),
                                         Output("n", "rows", None)))
    schema = T.StructType([T.StructField("g", T.LongType()), T.StructField("s", T.LongType()),
                           T.StructField("n", T.LongType())])
    groups = arrow_groups(aggregate, schema, ("g",))
    state = pa.table({"_mv_g0": pa.array([1, None], pa.int64()), "_mv_n": pa.array([2, 1], pa.int64()),
                      "_mv_a1": pa.array([Decimal(5), Decimal(7)], pa.decimal128(38, 0)),
                      "_mv_nn1": pa.array([2, 1], pa.int64())})

    def rows(values: list[tuple]) -> pa.Table:
        return pa.table({"g": pa.array([v[0] for v in values], pa.int64()),
                         "v": pa.array([v[1] for v in values], pa.int64()),
                         DIFF: pa.array([v[2] for v in values], pa.int64())})

    moved = groups.moved(state, groups.state_rows(rows([(1, 3, 1), (None, 7, -1), (2, None, 1)]), state.schema))
    assert moved.state.schema == state.schema
    assert sorted(moved.state.to_pylist(), key=str) == sorted([
        {"_mv_g0": 1, "_mv_n": 3, "_mv_a1": Decimal(8), "_mv_nn1": 3},
        {"_mv_g0": 2, "_mv_n": 1, "_mv_a1": None, "_mv_nn1": 0}], key=str)
    assert sorted(moved.retracted.to_pylist(), key=str) == sorted([{"g": 1, "s": 5, "n": 2},
                                                                   {"g": None, "s": 7, "n": 1}], key=str)
    assert sorted(moved.added.to_pylist(), key=str) == sorted([{"g": 1, "s": 8, "n": 3},
                                                               {"g": 2, "s": None, "n": 1}], key=str)
    assert sorted(moved.keys_moved.to_pylist(), key=str) == sorted([{"g": None}, {"g": 2}], key=str)
    with pytest.raises(NotEvaluated, match="does not fit int64"):
        groups.moved(state, groups.state_rows(rows([(1, 2 ** 62, 1), (1, 2 ** 62, 1)]), state.schema))


def test_averages_moved_here_are_sparks_to_the_last_place(spark, tmp_path):
    """Averages moved in Arrow (``arrow_groups.spark_average``) equal Spark's ``avg`` over the same
    rows: of a decimal, a tie at the output's last place rounded half up (away from zero, so a
    negative one too), a repeating quotient, a group of nulls; of integers, the division of doubles.
    An average of a small decimal, which Spark computes in floating point, is refused."""
    rows = ([("tie", 1, Decimal("0.01"))] + [("tie", 0, Decimal("0.00"))] * 31
            + [("negative-tie", -7, Decimal("-0.01"))] + [("negative-tie", 2, Decimal("0.00"))] * 31
            + [("third", 1, Decimal("1.00")), ("third", 1, Decimal("1.00")), ("third", 0, Decimal("0.00"))]
            + [("nulls", None, None), ("nulls", None, None), ("large", 2 ** 31 - 1, Decimal("99999999999999.99")),
               ("large", 2 ** 31 - 2, Decimal("99999999999999.98"))])
    schema = "g STRING, i INT, d DECIMAL(16,2)"
    sql = "SELECT g, avg(i) AS ai, avg(d) AS ad, avg(d * d) AS sq, count(*) AS n FROM src GROUP BY g"
    query = query_over_a_source(spark, tmp_path, sql, rows[0], schema)
    shape = linear_aggregate(query, TABLE_SCAN)
    assert [out.average.how for out in shape.outputs if out.kind == "avg"] == ["double", "decimal", "decimal"]
    groups = arrow_groups(shape, query.schema, ())
    state = pa.schema([("_mv_g0", pa.string()), ("_mv_n", pa.int64()), ("_mv_a1", pa.decimal128(38, 0)),
                       ("_mv_nn1", pa.int64()), ("_mv_a2", pa.decimal128(26, 2)), ("_mv_nn2", pa.int64()),
                       ("_mv_a3", pa.decimal128(38, 4)), ("_mv_nn3", pa.int64())]).empty_table()
    assert [f.name for f in state.schema][2:] == groups.value_names[1:], groups.value_names
    spark.createDataFrame(rows, schema).createOrReplaceTempView("src")
    expected = spark.sql(sql).collect()
    changed = pa.table({"g": [r[0] for r in rows], "i": pa.array([r[1] for r in rows], pa.int32()),
                        "d": pa.array([r[2] for r in rows], pa.decimal128(16, 2)),
                        shape.outputs[3].column: pa.array([None if r[2] is None else Context(prec=40).multiply(r[2], r[2]) for r in rows],
                                                          pa.decimal128(33, 4)),
                        DIFF: pa.repeat(pa.scalar(1, pa.int64()), len(rows))})
    added = groups.moved(state, groups.state_rows(changed, state.schema)).added
    assert sorted(added.to_pylist(), key=str) == sorted((r.asDict() for r in expected), key=str)
    by_group = {r["g"]: r for r in added.to_pylist()}
    assert by_group["tie"]["ad"] == Decimal("0.000313") and by_group["negative-tie"]["ad"] == Decimal("-0.000313")
    small = query_over_a_source(spark, tmp_path, "SELECT g, avg(d) AS a FROM src GROUP BY g", ("a", 1, Decimal(1)),
                                "g STRING, i INT, d DECIMAL(10,2)")
    assert arrow_groups(linear_aggregate(small, TABLE_SCAN), small.schema, ()) == (
        "an avg of small decimals is Spark's floating point")


def test_only_the_changed_groups_of_a_large_state_are_regrouped_and_move_as_all_would(monkeypatch):
    """A state far larger than its change regroups only the groups the change has
    (``arrow_groups.rows_in_groups``: null grouping values equal, a string and a date among the
    groups): the state, the rows retracted and added, and the keys moved are those of regrouping
    the whole state."""
    from mvsink.desired import arrow_groups as module

    aggregate = LinearAggregate(("k", "s", "d"), (Output("k", "group", "k"), Output("s", "group", "s"),
                                                 Output("d", "group", "d"), Output("v", "sum", "v", kept_as="decimal(22,2)"),
                                                 Output("n", "rows", None)))
    schema = T.StructType([T.StructField("k", T.LongType()), T.StructField("s", T.StringType()),
                           T.StructField("d", T.DateType()), T.StructField("v", T.DecimalType(22, 2)),
                           T.StructField("n", T.LongType())])
    groups = arrow_groups(aggregate, schema, ("k",))
    rng = random.Random(3)
    keys = [None, *range(300)]
    groups_of = [(k, rng.choice(["a", "b", None]), rng.choice([None, datetime.date(2024, 1, rng.randint(1, 3))]))
                 for k in keys for _ in range(2)]
    unique = sorted(set(groups_of), key=str)
    state = pa.table({"_mv_g0": pa.array([g[0] for g in unique], pa.int64()),
                      "_mv_g1": pa.array([g[1] for g in unique], pa.string()),
                      "_mv_g2": pa.array([g[2] for g in unique], pa.date32()),
                      "_mv_n": pa.array([2] * len(unique), pa.int64()),
                      "_mv_a3": pa.array([Decimal("1.50")] * len(unique), pa.decimal128(22, 2)),
                      "_mv_nn3": pa.array([2] * len(unique), pa.int64())})
    changed_groups = [rng.choice(unique) for _ in range(12)] + [(None, None, None), (999, "a", None)]
    rows = pa.table({"k": pa.array([g[0] for g in changed_groups], pa.int64()),
                     "s": pa.array([g[1] for g in changed_groups], pa.string()),
                     "d": pa.array([g[2] for g in changed_groups], pa.date32()),
                     "v": pa.array([Decimal("0.75")] * len(changed_groups), pa.decimal128(12, 2)),
                     DIFF: pa.array([rng.choice([1, -1]) for _ in changed_groups], pa.int64())})
    changed = groups.state_rows(rows, state.schema)
    assert module.rows_in_groups(state, changed, groups.group_names) is not None
    moved = groups.moved(state, changed)
    monkeypatch.setattr(module, "_REGROUPED_SHARE", 10 ** 9)
    whole = groups.moved(state, changed)

    def rows_of(table: pa.Table) -> list:
        return sorted(map(str, table.to_pylist()))

    assert moved.state.schema == whole.state.schema == state.schema
    for part in ("state", "retracted", "added", "keys_moved"):
        assert rows_of(getattr(moved, part)) == rows_of(getattr(whole, part)), part
    assert moved.added.num_rows and moved.retracted.num_rows


def test_groups_recomputed_here_are_sparks(spark, tmp_path):
    """An aggregate's groups recomputed from its input held here (:mod:`mvsink.desired.arrow_recompute`)
    are Spark's over the same rows: ``min`` and ``max`` of decimals, strings (by their UTF-8 bytes:
    ``é`` after ``z``), dates and booleans, a distinct count, sums, averages and counts, over rows
    repeated (counts above 1), nulls in values and in a grouping column, and a group of nulls. A
    step's rows retracted and added are the query's before and after it, a change deleting a row
    the input does not hold is left to Spark, and what Arrow does not compute as Spark is refused."""
    from mvsink.desired.arrow_recompute import arrow_recompute
    from mvsink.desired.linear_aggregate import recomputed_shape

    schema = "g STRING, k INT, d DECIMAL(12,2), s STRING, dt DATE, b BOOLEAN, i BIGINT"
    sql = ("SELECT g, k, max(d) AS hi, min(d) AS lo, max(s) AS top, min(s) AS bottom, min(dt) AS first, "
           "max(b) AS any_b, count(DISTINCT s) AS names, sum(d) AS total, avg(d) AS mean, avg(i) AS mean_i, "
           "count(i) AS counted, count(*) AS n FROM src GROUP BY g, k")
    rng = random.Random(5)
    strings = ["z", "é", "a", "Z", "", None]

    def row() -> tuple:
        return (rng.choice(["x", "y", None]), rng.choice([1, 2, None]),
                rng.choice([None, Decimal(rng.randint(-999, 999)) / 100]), rng.choice(strings),
                rng.choice([None, datetime.date(2024, 1, rng.randint(1, 9))]), rng.choice([True, False, None]),
                rng.choice([None, rng.randint(-5, 5)]))

    first = [row() for _ in range(40)]
    first += first[:10] + [("nulls", 9, None, None, None, None, None)] * 2
    query = query_over_a_source(spark, tmp_path, sql, first[0], schema)
    shape = recomputed_shape(query, TABLE_SCAN)
    assert [o.kind for o in shape.outputs] == ["group", "group", "max", "min", "max", "min", "min", "max", "distinct",
                                               "sum", "avg", "avg", "count", "rows"]
    rows_schema = shape.aggregate_input(query).schema
    recompute = arrow_recompute(shape, query.schema, rows_schema, ())

    def query_of(rows: list[tuple]) -> list[str]:
        spark.createDataFrame(rows, schema).createOrReplaceTempView("src")
        return sorted(map(str, (r.asDict() for r in spark.sql(sql).collect())))

    def held(rows: list[tuple]) -> pa.Table:
        return recompute.spark_inputs(spark.createDataFrame(rows, schema)).toArrow()

    state = held(first)
    assert max(state.column("_mv_n").to_pylist()) > 1
    assert sorted(map(str, recompute.outputs(state).to_pylist())) == query_of(first)
    deleted, inserted = first[5:15], [row() for _ in range(8)]
    second = first[:5] + first[15:] + inserted
    changed = pa.Table.from_pylist([dict(zip(rows_schema.names, r), _mv_diff=d) for d, part in ((-1, deleted), (1, inserted))
                                    for r in part], schema=arrow_schema(rows_schema).append(pa.field(DIFF, pa.int64())))
    moved = recompute.moved(state, recompute.state_rows(changed, state.schema))
    assert sorted(map(str, recompute.outputs(moved.state).to_pylist())) == query_of(second)
    before, after = Counter(query_of(first)), Counter(query_of(second))
    assert sorted(map(str, moved.retracted.to_pylist())) == sorted((before - after).elements())
    assert sorted(map(str, moved.added.to_pylist())) == sorted((after - before).elements())
    assert moved.retracted.num_rows and moved.added.num_rows
    with pytest.raises(NotEvaluated, match="does not have"):
        recompute.moved(moved.state, recompute.state_rows(changed.slice(0, len(deleted)), state.schema))
    for refused in ["SELECT g, max(CAST(d AS DOUBLE)) AS m FROM src GROUP BY g",
                    "SELECT g, count(DISTINCT s) AS a, count(DISTINCT d) AS b FROM src GROUP BY g",
                    "SELECT g, max(s) || 'x' AS m FROM src GROUP BY g"]:
        assert recomputed_shape(query_over_a_source(spark, tmp_path, refused, first[0], schema), TABLE_SCAN) is None, refused
    by_double = query_over_a_source(spark, tmp_path, "SELECT CAST(k AS DOUBLE) AS x, max(d) AS m FROM src "
                                    "GROUP BY CAST(k AS DOUBLE)", first[0], schema)
    double_shape = recomputed_shape(by_double, TABLE_SCAN)
    assert arrow_recompute(double_shape, by_double.schema, double_shape.aggregate_input(by_double).schema,
                           ()) == "it groups by _groupingexpression of type double"
