"""Union-all views (:mod:`mvsink.desired.join`): which queries are maintained as one, and that
their changes from their sources' changes equal the full evaluation at every time."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from helpers import commit_sql, create_source, insert, query_results_at_every_time, replace_where
from mvsink import MaterializedView, SnapshotInput, ViewDefinition, read_view

ORDERS, RETURNS, CUSTOMERS = ("id BIGINT, cust BIGINT, amount INT", "id BIGINT, cust BIGINT, amount BIGINT",
                              "cust BIGINT, segment STRING")
#: A row-wise source and an inner join of the two others.
UNION_JOIN = ("SELECT o.id, o.amount, 'order' AS segment FROM orders o WHERE o.amount > 1 "
              "UNION ALL SELECT r.id, -r.amount, c.segment FROM returns r JOIN customers c ON r.cust = c.cust")
#: A union (nested in a join) of two sources, joined with the third.
JOIN_OVER_UNION = ("SELECT u.id, u.amount, c.segment FROM (SELECT id, cust, amount FROM orders UNION ALL "
                   "SELECT id, cust, amount * 10 FROM returns WHERE amount <> 3) u "
                   "JOIN customers c ON u.cust = c.cust")
#: Three row-wise sources, nested unions (which the optimizer flattens).
THREE = ("SELECT id, cust FROM orders UNION ALL (SELECT id, cust FROM returns WHERE amount > 0 "
         "UNION ALL SELECT cust * 100 AS id, cust FROM customers WHERE segment <> 'z')")
#: A linear aggregate over a union all, and a union (distinct).
AGGREGATE = ("SELECT cust, count(*) AS n, sum(amount) AS total FROM (SELECT cust, amount FROM orders "
             "UNION ALL SELECT cust, amount FROM returns) GROUP BY cust")
DISTINCT = "SELECT cust FROM orders UNION SELECT cust FROM returns UNION SELECT cust FROM customers"


def _sources(spark, tmp_path, rng: random.Random | None = None) -> dict[str, str]:
    rng = rng or random.Random(0)
    paths = {name: str(tmp_path / name) for name in ("orders", "returns", "customers")}
    create_source(spark, paths["orders"], [(i, rng.choice([1, 2, 3, None]), rng.randint(0, 5)) for i in range(12)],
                  ORDERS)
    create_source(spark, paths["returns"], [(i, rng.choice([1, 2, 3, None]), rng.randint(0, 5))
                                            for i in range(50, 58)], RETURNS)
    create_source(spark, paths["customers"], [(1, "x"), (2, "y"), (2, "y"), (3, "z"), (None, "x")], CUSTOMERS)
    return paths


def _view(spark, tmp_path, name: str, sql: str, sources: dict[str, str], refresh: str = "auto",
          replica: str = "r1") -> MaterializedView:
    """A view of ``sql`` over those of ``sources`` it names."""
    read = {source: path for source, path in sources.items() if source in sql}
    return MaterializedView(spark, ViewDefinition(name, str(tmp_path / name), SnapshotInput(sql=sql, refresh=refresh),
                                                  sources=read, replica_id=replica))


@pytest.fixture(scope="module")
def unchanged_sources(spark, tmp_path_factory) -> dict[str, str]:
    """:func:`_sources` for the tests that only read them, made once."""
    return _sources(spark, tmp_path_factory.mktemp("union_sources"))


@pytest.mark.parametrize("sql, strategy", [
    ("SELECT id, amount FROM orders UNION ALL SELECT id, amount FROM returns", "union all"),
    (UNION_JOIN, "union all"),
    (JOIN_OVER_UNION, "union all"),
    (THREE, "union all"),
    ("SELECT id FROM orders UNION ALL SELECT DISTINCT id FROM returns", None),
    ("SELECT cust FROM orders UNION SELECT cust FROM returns", "linear aggregate"),  # distinct: its groups' counts
    ("SELECT o.id FROM orders o LEFT JOIN customers c ON o.cust = c.cust UNION ALL SELECT id FROM returns", None),
    ("SELECT id FROM orders UNION ALL SELECT id FROM returns WHERE rand() > 0.5", None),
    ("SELECT id FROM orders UNION ALL SELECT id FROM returns LIMIT 3", None),
], ids=["two-row-wise", "row-wise-and-join", "join-over-union", "nested-three", "distinct-branch", "union-distinct",
        "left-join-branch", "rand", "limit"])
def test_which_queries_are_union_alls(spark, tmp_path, unchanged_sources, sql, strategy):
    """Each view reads only the sources its query names (each once); a query is a union all
    where every branch is row-wise or an inner join, and only then; ``UNION`` (distinct) is the
    linear aggregate it is (count of rows per distinct row), never a union all."""
    desired = _view(spark, tmp_path, "v", sql, unchanged_sources).desired
    taken = ("union all" if desired.join and desired._no_rows else "inner join" if desired.join
             else "linear aggregate" if desired.aggregate is not None else None)
    assert taken == strategy, desired.strategy_description()
    if strategy == "union all":
        described = desired.strategy_description()
        assert described.startswith("its query is a union all"), described
        assert ("read whole" in described or "read only where" in described) == ("JOIN" in sql), described
    if strategy is None:
        assert "evaluated in full" in desired.strategy_description()


#: One source in two branches (and two more sources): each read a source of its own (``orders__2``).
TWICE = ("SELECT id FROM orders WHERE amount > 2 UNION ALL SELECT id FROM orders WHERE amount < 1 "
         "UNION ALL SELECT id FROM returns UNION ALL SELECT cust FROM customers")


def test_a_source_read_twice_is_a_union_all_and_a_cte_read_twice_is_maintained_by_the_operators(spark, tmp_path):
    """A source in two branches of the text is two sources: a union all (taken under
    ``incremental``). A CTE read in two branches is one read of the text, two leaves of one source
    in the plan: no shape takes it, the operators do (a union of the source's change twice)."""
    paths = _sources(spark, tmp_path)
    desired = _view(spark, tmp_path, "v", TWICE, paths, "incremental").desired
    assert desired.join and desired._no_rows and desired._reads.extra == {"orders__2": "orders"}
    cte = ("WITH o AS (SELECT id, amount FROM orders) SELECT id FROM o WHERE amount > 2 "
           "UNION ALL SELECT id FROM o WHERE amount < 1")
    desired = _view(spark, tmp_path, "c", cte, paths, "incremental").desired
    assert not desired.join and desired.aggregate is None and not desired.row_wise
    assert ("maintained by the delta rules of its plan's operators, composed: Union(Project(Filter(orders)), "
            "Project(Filter(orders)))") in desired.strategy_description()


def _edit(spark, paths: dict[str, str], rng: random.Random, next_id: list[int]) -> None:
    """One commit to one source: inserts with a duplicate and null keys, updates, deletes, a row
    deleted and inserted again in one commit, customers changing segment or appearing."""
    name = rng.choice(["orders", "returns", "customers"])
    src = paths[name]
    kind = rng.choice(["insert", "update", "delete", "reinsert"])
    if name == "customers":
        if kind == "insert":
            insert(spark, src, [(rng.choice([1, 2, 3, 4, None]), rng.choice("xyz"))])
        elif kind == "delete":
            commit_sql(spark, f"DELETE FROM delta.`{src}` WHERE cust = {rng.randint(1, 4)}")
        else:
            commit_sql(spark, f"UPDATE delta.`{src}` SET segment = '{rng.choice('xyz')}' "
                              f"WHERE cust = {rng.randint(1, 4)}")
    elif kind == "insert":
        rows = [(next_id[0] + i, rng.choice([1, 2, 3, 4, None]), rng.randint(0, 5)) for i in range(rng.randint(1, 3))]
        next_id[0] += len(rows)
        insert(spark, src, rows + rows[:1])  # a duplicate
    elif kind == "update":
        commit_sql(spark, f"UPDATE delta.`{src}` SET cust = {rng.randint(1, 4)}, amount = amount + 1 "
                          f"WHERE pmod(id, 4) = {rng.randint(0, 3)}")
    elif kind == "delete":
        commit_sql(spark, f"DELETE FROM delta.`{src}` WHERE pmod(id, 5) = {rng.randint(0, 4)}")
    else:
        id_ = rng.choice([*range(12), *range(50, 58)])
        replace_where(spark, src, "id", id_)


def _catch_up(view: MaterializedView) -> set[str]:
    """Step ``view`` until caught up (as :meth:`MaterializedView.run_until_caught_up`); the
    strategies its steps' changes were computed by."""
    strategies = set()
    for _ in range(100):
        report = view.step()
        strategies.add(report.strategy)
        last = view.timeline.last()
        if (report.desc is None and last is not None and report.upper >= view.timeline.upper
                and last.versions == view.desired.latest_versions()):
            return strategies - {None, "hydration"}
    raise AssertionError("did not catch up")


@pytest.mark.parametrize("sql, strategy, seed", [
    (UNION_JOIN, "union all", 25), (JOIN_OVER_UNION, "union all", 26), (THREE, "union all", 27),
    (AGGREGATE, "linear aggregate", 28), (DISTINCT, "linear aggregate", 29), (TWICE, "union all", 30),
], ids=["union-join", "join-over-union", "three", "aggregate", "distinct", "source-twice"])
def test_union_changes_equal_the_full_evaluation_at_every_time(spark, tmp_path, sql, strategy, seed):
    """The view from its sources' changes; 1-3 commits to any of the three sources per time
    (several to one, or to two or three in one time), those to ``returns`` without a change data
    feed, and a replica that catches up over every time at once at the end. Every step that
    computes changes reports the strategy; at every time the view has the rows of the query
    evaluated in full over the sources at that time's versions."""
    rng = random.Random(seed)
    paths = _sources(spark, tmp_path, rng)
    # returns' versions from now on have no change data feed: their changes are read from the log
    spark.sql(f"ALTER TABLE delta.`{paths['returns']}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    view = _view(spark, tmp_path, "maintained", sql, paths, "incremental")
    late = _view(spark, tmp_path, "maintained", sql, paths, "incremental", replica="r2")
    next_id = [100]
    strategies = set()
    for round_ in range(8):
        strategies |= _catch_up(view)
        if round_ == 0:
            late.run_until_caught_up()
        for _ in range(rng.randint(1, 3)):
            _edit(spark, paths, rng, next_id)
    strategies |= _catch_up(view) | _catch_up(late)
    assert strategies == {strategy}
    upper = view.observed_upper
    assert upper >= 6  # a commit matching no row may write no version
    assert view.desired._previous is None, "a union keeps no result, an aggregate its groups"
    target = str(tmp_path / "maintained")
    query_results_at_every_time(spark, paths, sql, {"maintained": target}, target + "_timeline", upper)


def test_refresh_incremental_accepts_a_union_all(spark, tmp_path):
    """``incremental`` takes a union all (and an aggregate over one), and a union with an outer join
    in a branch (no shape does: the operators); a change to one branch's source reaches the view."""
    paths = _sources(spark, tmp_path)
    view = _view(spark, tmp_path, "v", UNION_JOIN, paths, "incremental")
    assert view.desired.join and view.desired._no_rows
    _view(spark, tmp_path, "a", AGGREGATE, paths, "incremental")
    left = "SELECT o.id FROM orders o LEFT JOIN customers c ON o.cust = c.cust UNION ALL SELECT id FROM returns"
    assert "Union(Project(Join (by key)(" in _view(spark, tmp_path, "l", left, paths, "incremental").desired.strategy_description()
    view.run_until_caught_up()
    insert(spark, paths["returns"], [(900, 2, 4)])
    assert _catch_up(view) == {"union all"}
    rows = read_view(spark, str(tmp_path / "v"), "v", view.observed_upper - 1).collect()
    assert Counter(tuple(r) for r in rows)[(900, -4, "y")] == 2  # customer 2 is there twice


def test_explain_says_a_union_all(spark, tmp_path, capsys):
    """``mvsink explain view.yaml`` names the strategy, with the join keys of the join branch."""
    from mvsink.replica import cli

    _sources(spark, tmp_path)
    config = tmp_path / "view.yaml"
    config.write_text("view_id: v\ntarget: target\nsources: {orders: orders, returns: returns, customers: customers}\n"
                      f"input:\n  kind: snapshot\n  sql: \"{UNION_JOIN}\"\n")
    code = cli.main(["explain", str(config)])
    out = "".join(capsys.readouterr())
    assert code == 0 and "its query is a union all" in out and "(customers.cust = returns.cust)" in out, out
