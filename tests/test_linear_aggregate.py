"""Linear aggregate views (:mod:`mvsink.desired.linear_aggregate`): which queries are, and that their changes
from the source's change feed are exactly the differences of the query's results (groups that
appear and vanish, null groups, sums of nulls, decimals, averages of integers and decimals as Spark
computes them, sums and averages of expressions), checked against the query at every time."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from helpers import (create_source, from_the_feed, insert, query_over_a_source,
                     query_results_at_every_time, random_commit, through_commits_without_feed)
from mvsink import MaterializedView, SnapshotInput, ViewDefinition, read_view, view_errors
from mvsink.desired import snapshot
from mvsink.desired.key_check import KeyErrors
from mvsink.desired.linear_aggregate import linear_aggregate
from mvsink.desired.row_wise import TABLE_SCAN

SCHEMA = "id BIGINT, grp STRING, sub INT, qty INT, price DECIMAL(10, 2), weight DOUBLE"
QUERY = ("SELECT grp, sub, count(*) AS n, sum(qty) AS qty, count(price) AS priced, sum(price) AS total "
         "FROM src WHERE id % 7 <> 3 GROUP BY grp, sub")
#: Averages of an INT, a BIGINT, a DECIMAL(10, 2) (which Spark's optimizer averages as doubles of
#: its unscaled values), a DECIMAL(20, 2) and a DECIMAL(21, 4) expression, and a sum of a product.
#: Without GROUP BY: one row, even while the filter passes none (counts 0; sums, averages null).
GLOBAL = ("SELECT count(*) AS n, sum(qty) AS qty, count(price) AS priced, avg(price) AS mean, sum(price) AS total "
          "FROM src WHERE grp = 'd'")
AVERAGES = ("SELECT grp, count(*) AS n, avg(qty) AS avg_qty, avg(id) AS avg_id, avg(price) AS avg_price, "
            "avg(CAST(price AS DECIMAL(20, 2))) AS avg_wide, avg(price * price) AS avg_square, "
            "sum(qty * price) AS qty_price FROM src WHERE id % 7 <> 3 GROUP BY grp")


@pytest.mark.parametrize("sql, linear", [
    (QUERY, True),
    ("SELECT grp, count(*) AS n FROM src GROUP BY grp", True),
    ("SELECT count(qty) AS n, upper(grp) AS g FROM src GROUP BY upper(grp)", True),  # a grouping expression
    ("SELECT grp, sum(qty) AS s FROM src WHERE qty > 0 GROUP BY grp", True),
    ("SELECT grp, sum(qty + 1) AS s FROM src GROUP BY grp", True),      # of an expression of the row
    (AVERAGES, True),
    ("SELECT grp, sum(weight) AS w FROM src GROUP BY grp", False),      # floating point: order-dependent
    ("SELECT grp, avg(weight) AS a FROM src GROUP BY grp", False),
    ("SELECT grp, avg(qty) + 1 AS a FROM src GROUP BY grp", False),
    ("SELECT grp, max(qty) AS m FROM src GROUP BY grp", False),
    ("SELECT grp, count(DISTINCT qty) AS d FROM src GROUP BY grp", False),
    ("SELECT grp, count(*) AS n FROM src GROUP BY grp HAVING count(*) > 1", False),
    ("SELECT count(*) AS n FROM src WHERE qty > 0", True),               # no GROUP BY: one row, even of none
    ("SELECT count(*) AS n FROM src", False),  # Delta counts it from its log (no Aggregate, no read): full
    ("SELECT sum(qty + 1) AS s, avg(price) AS a FROM src WHERE grp = 'a'", True),
    ("SELECT max(qty) AS m FROM src", False),
    ("SELECT grp, count(*) * 2 AS n FROM src GROUP BY grp", False),
    ("SELECT grp, count(*) FILTER (WHERE qty > 0) AS n FROM src GROUP BY grp", False),
    ("SELECT grp, count(*) AS n FROM src WHERE qty > (SELECT avg(qty) FROM src) GROUP BY grp", False),
    ("SELECT grp, count(*) AS n FROM src WHERE rand() > 0.5 GROUP BY grp", False),
    ("SELECT a.grp, count(*) AS n FROM src a JOIN src b ON a.id = b.id GROUP BY a.grp", False),
])
def test_which_queries_are_linear_aggregates(spark, tmp_path, sql, linear):
    query = query_over_a_source(spark, tmp_path, sql, (1, "a", 1, 2, 1.5, 0.5), SCHEMA)
    assert (linear_aggregate(query, TABLE_SCAN) is not None) is linear


def _row(rng: random.Random, i: int) -> tuple:
    return (i, rng.choice(["a", "b", "c", None]), rng.choice([1, 2, None]), rng.choice([None, 0, 1, 5, -3]),
            rng.choice([None, Decimal("0.10"), Decimal("2.50"), Decimal("-1.25")]), rng.random())


def _edit(spark, src: str, rng: random.Random, next_id: list[int]) -> None:
    """One source commit: values set to null or changed (rows moving between groups), a delete
    (which can empty a group), or inserts (which can start one)."""
    def inserts():
        rows = [_row(rng, next_id[0] + i) for i in range(rng.randint(1, 5))]
        next_id[0] += len(rows)
        return rows

    random_commit(
        spark, src, rng,
        update=lambda: (f"UPDATE delta.`{src}` SET qty = CASE WHEN qty IS NULL THEN 4 ELSE NULL END, "
                        f"price = CASE WHEN price IS NULL THEN 1.75 WHEN price > 1 THEN NULL ELSE price + 1 END, "
                        f"grp = CASE WHEN id % 3 = 0 THEN 'd' ELSE grp END "
                        f"WHERE pmod(id, {rng.randint(2, 5)}) = {rng.randint(0, 1)}"),
        delete=lambda: f"DELETE FROM delta.`{src}` WHERE pmod(id, 4) = {rng.randint(0, 3)} OR grp = 'd'",
        inserts=inserts)


@pytest.mark.parametrize("sql, key, rounds, one_task, feed", [
    (QUERY, (), 7, True, True),
    # grp is not an output: rows of different groups can be equal, the updates are consolidated
    ("SELECT sub, count(*) AS n, sum(qty) AS qty FROM src GROUP BY grp, sub", (), 5, True, True),
    (QUERY, ("grp", "sub"), 5, False, True),      # the grouping columns: groups with a null are errors
    (QUERY, ("sub",), 5, True, True),             # part of them: keys with several rows, appearing and ending
    (QUERY, ("grp", "sub", "n"), 5, False, True),  # with an aggregate: a group's key changes with its count
    (QUERY, ("sub",), 5, True, False),            # a source without change data feed: its commits' files
    (AVERAGES, (), 7, True, True),                # averages of groups that lose their values and rows
    (AVERAGES, ("grp",), 5, False, True),
    (GLOBAL, (), 7, True, True),
    (GLOBAL, ("n",), 5, False, False),            # keyed by its count; its one row moves its key
], ids=["keyless", "equal-rows", "key-groups", "key-part", "key-aggregate", "key-part-no-feed", "averages",
        "averages-keyed", "no-group-by", "no-group-by-keyed-no-feed"])
def test_aggregate_changes_equal_the_differences_of_the_query_results(spark, tmp_path, monkeypatch, sql, key,
                                                                        rounds, one_task, feed):
    """The view from the change feed (linear aggregate), several commits per time, and (without
    change data feed, or averaged) a replica that catches up over many times at once. Both
    replicas' commits equal the query over the
    source's version at every time: its rows (groups with null values are
    rows of a keyless view) and, keyed, its key errors. The state is moved in one task (few
    groups, a small feed) or, as for many groups, shuffled by group. A key that holds every
    grouping column has one row at most: its touched keys are never checked after hydration."""
    if not one_task:
        monkeypatch.setattr(snapshot, "ONE_TASK_GROUPS", -1)
    checks = []
    corrections = KeyErrors.corrections
    monkeypatch.setattr(KeyErrors, "corrections", lambda self, persisted, buffer, touched, since: (
        checks.append(touched is not None), corrections(self, persisted, buffer, touched, since))[1])
    rng = random.Random(11)
    src = str(tmp_path / "src")
    create_source(spark, src, [_row(rng, i) for i in range(40)], SCHEMA)
    if not feed:
        spark.sql(f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    next_id = [100]
    view = from_the_feed(spark, tmp_path, src, sql, lambda: _edit(spark, src, rng, next_id),
                         rounds=rounds, rng=rng, key=key, late=not feed or sql == AVERAGES and not key)
    assert view.desired.aggregate is not None
    assert view.desired._previous is None, "a linear aggregate keeps its state, not its result"
    if sql == GLOBAL:  # one row at every time, over no rows too (the filter passed none at some time)
        counts = [[r.n for r in read_view(spark, str(tmp_path / "from_feed"), "from_feed", t).collect()]
                  for t in range(view.observed_upper)]
        assert all(len(n) == 1 for n in counts) and [0] in counts and any(n != [0] for n in counts), counts
        assert not any(checks), "one row: no key can have two"
    elif key:
        errors = {r[0].split(" ")[0] for t in range(view.observed_upper)
                  for r in view_errors(spark, str(tmp_path / "from_feed"), t).collect()}
        assert "null" in errors and ("duplicate" in errors) == (key == ("sub",)), errors
        assert any(checks) == (key == ("sub",)), checks


@pytest.mark.parametrize("deletion_vectors", [True, False], ids=["deletion-vectors", "files"])
def test_an_aggregate_over_versions_without_feed(spark, tmp_path, caplog, deletion_vectors):
    """Versions written with the change data feed off: the view moves its groups by their added
    and removed files, or where they wrote deletion vectors evaluates the query for them, then
    takes its state from the source again; exactly, and it goes on from the source's changes."""
    sql = "SELECT grp, count(*) AS n, sum(qty) AS qty FROM src GROUP BY grp"
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, "ab"[i % 2], 1, i, None, 0.0) for i in range(10)], SCHEMA)
    view = MaterializedView(spark, ViewDefinition("v", tgt, SnapshotInput(sql=sql, refresh="incremental"), key=("grp",),
                                                  sources={"src": src}, replica_id="r1"))
    view.run_until_caught_up()
    through_commits_without_feed(spark, view, src, caplog, f"UPDATE delta.`{src}` SET qty = 100 WHERE id < 3",
                                 lambda: (insert(spark, src, [(20, "c", 1, 7, None, 0.0)]),
                                          spark.sql(f"DELETE FROM delta.`{src}` WHERE grp = 'a'")),
                                 deletion_vectors)
    assert view.desired.aggregate is not None and view.desired._previous is None
    query_results_at_every_time(spark, src, sql, {"v": tgt}, tgt + "_timeline", view.observed_upper)


def test_integer_sums_at_their_types_limits(spark, tmp_path):
    """A deleted row's value is negated: the smallest INT, negated, does not fit an INT, and a
    BIGINT sum near its limit must stay exact; the state keeps integer sums as decimals."""
    sql = "SELECT grp, sum(sub) AS small, sum(id) AS big FROM src GROUP BY grp"
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(9223372036854775000, "a", -2147483648, 1, None, 0.0), (5, "a", 7, 1, None, 0.0)],
                  SCHEMA)
    view = MaterializedView(spark, ViewDefinition("v", tgt, SnapshotInput(sql=sql), key=("grp",),
                                                  sources={"src": src}, replica_id="r1"))
    assert view.desired.aggregate is not None
    view.run_until_caught_up()
    spark.sql(f"DELETE FROM delta.`{src}` WHERE sub < 0")
    insert(spark, src, [(9223372036854775000, "a", 1, 1, None, 0.0)])
    view.run_until_caught_up()
    query_results_at_every_time(spark, src, sql, {"v": tgt}, tgt + "_timeline", view.observed_upper)


@pytest.mark.parametrize("sql", ["SELECT DISTINCT grp FROM src",
                                 "SELECT grp, sum(qty) AS qty FROM src GROUP BY grp"],
                         ids=["distinct", "sum-of-nulls"])
def test_a_group_appears_and_vanishes_with_the_same_values(spark, tmp_path, sql):
    """A group whose output row has the same values whether it has rows or not (grouping columns
    only; a sum of only nulls) still appears and vanishes with its rows."""
    src = str(tmp_path / "src")
    create_source(spark, src, [(1, "a", 1, 5, None, None)], SCHEMA)
    view = MaterializedView(spark, ViewDefinition("v", str(tmp_path / "v"), SnapshotInput(sql=sql),
                                                  sources={"src": src}, replica_id="r1"))
    assert view.desired.aggregate is not None
    view.run_until_caught_up()

    def rows() -> set[tuple]:
        view.run_until_caught_up()
        return {r[0] for r in read_view(spark, str(tmp_path / "v"), "v", view.observed_upper - 1).collect()}

    insert(spark, src, [(2, "b", 1, None, None, None)])
    assert rows() == {"a", "b"}
    spark.sql(f"UPDATE delta.`{src}` SET grp = 'c' WHERE grp = 'b'")
    assert rows() == {"a", "c"}
    spark.sql(f"DELETE FROM delta.`{src}` WHERE grp = 'c'")
    assert rows() == {"a"}
