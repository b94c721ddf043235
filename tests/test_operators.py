"""The operators (:mod:`mvsink.desired.operators`): each plan node's delta rule, composed.

* the planner gives each node its rule, and refuses what none maintains, naming it;
* a ``row_number() ... = 1`` dedup (no shape maintains it) is maintained by the operators, and
  equals the query at every time;
* with the shapes' strategies off, the operators alone maintain the anti-join forms the issue
  found wrong, and random views of every family of the differential tester (a late replica
  catching up over every time included), each equal to the full evaluation at every time;
* the tester fails them where a rule is broken on purpose (a recompute by key reading its
  inputs after the step on both sides).
"""

from __future__ import annotations

import pytest

from differential.grammar import FAMILIES
from differential.runner import Runner, random_case
from differential.shrink import reproduction
from helpers import create_source, insert, query_results_at_every_time
from mvsink import MaterializedView, SnapshotInput, ViewDefinition
from test_engine_defects import ANTI_JOINS, CUSTOMER, ORDERS

#: The seed of the case of one view per family run with the operators alone.
FAMILIES_SEED = 31
#: test_engine_defects' anti-join forms run by the operators alone: the issue's two, and a rollup of one.
ANTI_FORMS = ("v", "plain", "rollup")
#: Each order with its row number among its customer's, latest first.
LATEST = "SELECT *, row_number() OVER (PARTITION BY o_custkey ORDER BY o_orderkey DESC) AS rn FROM orders"


@pytest.fixture
def operators_alone(monkeypatch):
    """The shapes' strategies off: every query the operators maintain is maintained by them."""
    from mvsink.desired.snapshot import SnapshotDesired

    monkeypatch.setattr(SnapshotDesired, "shapes", False)


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("operators")
    sources = {"customer": str(base / "customer"), "orders": str(base / "orders")}
    create_source(spark, sources["customer"], CUSTOMER, "c_custkey BIGINT, c_nationkey BIGINT")
    create_source(spark, sources["orders"], ORDERS, "o_orderkey BIGINT, o_custkey BIGINT, o_shippriority INT")
    return base, sources


def _view(spark, base, sources, name: str, sql: str, refresh: str = "incremental") -> MaterializedView:
    return MaterializedView(spark, ViewDefinition(name, str(base / name), SnapshotInput(sql=sql, refresh=refresh),
                                                  sources=sources, replica_id="r1"))


@pytest.mark.parametrize("sql, described", [
    ("SELECT c_nationkey, count(*) AS n FROM customer c LEFT JOIN orders o ON c_custkey = o_custkey "
     "AND o_shippriority <> 0 WHERE o_orderkey IS NULL GROUP BY c_nationkey",
     "Aggregate (groups held)(Project(Filter(Join (by key)(customer, Project(Filter(orders))))))"),
    ("SELECT o_custkey, o_orderkey FROM (SELECT *, row_number() OVER (PARTITION BY o_custkey "
     "ORDER BY o_orderkey DESC) AS rn FROM orders) WHERE rn = 1",
     "Project(Filter(Window (by key)(WindowGroupLimit(Project(orders)))))"),
    ("SELECT c_nationkey, count(*) AS n FROM customer WHERE c_custkey NOT IN (SELECT o_custkey FROM orders) "
     "GROUP BY c_nationkey",
     "Aggregate (groups held)(Project(Join (recomputed whole)(customer, Project(orders))))"),
    ("SELECT o_custkey, max(o_orderkey) AS m FROM orders GROUP BY o_custkey", "Aggregate (by key)(Project(orders))"),
    ("SELECT c_custkey, o_orderkey FROM customer JOIN orders ON c_custkey = o_custkey "
     "UNION ALL SELECT c_custkey, c_nationkey FROM customer",
     "Union(Project(Join (delta rule)(Project(customer), Project(orders))), customer__2)"),
])
def test_the_planner_gives_each_node_its_rule(spark, tables, operators_alone, sql, described):
    base, sources = tables
    view = _view(spark, base, sources, "planned", sql)
    assert view.desired._operators.describe() == described
    assert described in view.desired.strategy_description()


@pytest.mark.parametrize("sql, refused", [
    ("SELECT o_custkey FROM orders LIMIT 3", "a GlobalLimit"),
    ("SELECT o_custkey, rand() AS r FROM orders", "a non-deterministic expression"),
    ("SELECT o_custkey, collect_list(o_orderkey) AS l FROM orders GROUP BY o_custkey",
     "an aggregate whose value depends on the order of its rows (collect_list)"),
    ("SELECT max(o_orderkey) AS m FROM customer LEFT JOIN orders ON c_custkey = o_custkey",
     "an Aggregate with no key (of everything) at its top"),
])
def test_the_planner_names_what_no_operator_maintains(spark, tables, operators_alone, sql, refused):
    """``refresh incremental`` is refused at start with the reason; ``auto`` evaluates it in full."""
    base, sources = tables
    with pytest.raises(Exception, match="cannot be maintained") as raised:
        _view(spark, base, sources, "refused", sql)
    assert refused in str(raised.value)
    assert "evaluated in full" in _view(spark, base, sources, "refused", sql, "auto").desired.strategy_description()


@pytest.mark.parametrize("sql, distinct", [
    ("SELECT o_custkey, count(*) AS n FROM orders GROUP BY o_custkey", [{"o_custkey"}]),
    ("SELECT DISTINCT o_custkey, o_shippriority FROM orders WHERE o_orderkey > 3", [{"o_custkey", "o_shippriority"}]),
    (f"SELECT o_custkey, o_orderkey FROM ({LATEST}) WHERE rn = 1", [{"o_custkey"}]),
    (f"SELECT o_custkey, o_orderkey FROM ({LATEST}) WHERE rn <= 2", []),
    (f"SELECT o_orderkey FROM ({LATEST}) WHERE rn = 1", []),
    ("SELECT c_custkey, o_orderkey FROM customer JOIN orders ON c_custkey = o_custkey", []),
], ids=["grouped", "distinct", "dedup", "two-per-key", "key-not-output", "join"])
def test_the_columns_no_two_rows_share(spark, tables, sql, distinct):
    """A plan's distinct keys: Spark's (groupings, ``DISTINCT``) and a ``row_number() = 1``
    filter's partition, only where the query outputs them."""
    from mvsink.desired.operators.distinct import distinct_keys

    base, sources = tables
    session = spark.newSession()
    for name, path in sources.items():
        session.read.format("delta").load(path).createOrReplaceTempView(name)
    assert [set(keys) for keys in distinct_keys(session.sql(sql))] == distinct


def test_a_dedup_is_maintained_by_its_window(spark, tmp_path, strategies, monkeypatch):
    """The latest order per customer (``row_number() ... = 1``), keyed by the customer: each step
    recomputes the partitions of the customers whose orders changed, and the view equals the query
    (a null customer an error) at every time. Its plan has one row per customer: once hydrated,
    no step runs the key check, though customers appear and go."""
    from mvsink.desired.key_check import KeyErrors

    checks = []
    corrections = KeyErrors.corrections
    monkeypatch.setattr(KeyErrors, "corrections", lambda self, *args: checks.append(args) or corrections(self, *args))
    sources = {"orders": str(tmp_path / "orders")}
    create_source(spark, sources["orders"], ORDERS + [(20, 1, 3), (21, None, 1)],
                  "o_orderkey BIGINT, o_custkey BIGINT, o_shippriority INT")
    sql = ("SELECT o_custkey, o_orderkey, o_shippriority FROM (SELECT *, row_number() OVER (PARTITION BY o_custkey "
           "ORDER BY o_shippriority DESC, o_orderkey) AS rn FROM orders) WHERE rn = 1")
    view = MaterializedView(spark, ViewDefinition("v", str(tmp_path / "v"), SnapshotInput(sql=sql, refresh="incremental"),
                                                  sources=sources, replica_id="r1", key=("o_custkey",)))
    view.run_until_caught_up()
    hydrated = len(checks)
    orders = sources["orders"]
    for commit in [f"UPDATE delta.`{orders}` SET o_shippriority = 9 WHERE o_orderkey = 10",
                   f"DELETE FROM delta.`{orders}` WHERE o_orderkey IN (20, 12)",
                   None,
                   f"UPDATE delta.`{orders}` SET o_custkey = 2 WHERE o_orderkey = 10"]:
        if commit is None:
            insert(spark, orders, [(22, 3, 5), (23, None, 7)])
        else:
            spark.sql(commit)
        view.run_until_caught_up()
    query_results_at_every_time(spark, sources, sql, {"v": str(tmp_path / "v")}, str(tmp_path / "v") + "_timeline",
                                view.observed_upper, key=("o_custkey",))
    assert set(strategies) == {"operators"}, strategies
    assert view.desired._key_distinct and len(checks) == hydrated, checks


#: Scalar subqueries (uncorrelated): TPC-H Q22's form (a customer's column against an average of
#: customers', an anti join with orders), Q11's (a HAVING against a share of a total), Q15's (the
#: groups equal to the greatest of the same aggregate).
SCALARS = {
    "q22": ("SELECT c_nationkey, count(*) AS n, sum(c_custkey) AS s FROM customer WHERE c_custkey > "
            "(SELECT avg(c_custkey) FROM customer WHERE c_nationkey = 1) AND NOT EXISTS "
            "(SELECT 1 FROM orders WHERE o_custkey = c_custkey) GROUP BY c_nationkey"),
    "q11": ("SELECT o_custkey, count(*) AS n FROM orders GROUP BY o_custkey "
            "HAVING count(*) * 4 > (SELECT count(*) FROM orders WHERE o_shippriority < 5)"),
    "q15": ("WITH per AS (SELECT o_custkey, sum(o_shippriority) AS total FROM orders GROUP BY o_custkey) "
            "SELECT c_custkey, c_nationkey, total FROM customer JOIN per ON c_custkey = o_custkey "
            "WHERE total = (SELECT max(total) FROM per)"),
}


def test_scalar_subqueries_by_their_values(spark, tmp_path, operators_alone, monkeypatch):
    """Q22's, Q11's and Q15's forms through commits that move their subqueries' values and commits
    that do not (orders only, for Q22's): each equal to the query at every time, by the operators,
    both ways of the rule taken (the input's change over the values kept, the node recomputed
    where one moved)."""
    from mvsink.desired.operators import scalars

    ways = []
    intact = scalars.OverScalars._change

    def recorded(self, step):
        ways.append(any(s.value(step, "before") != s.value(step, "after") for s in self.scalars))
        return intact(self, step)

    monkeypatch.setattr(scalars.OverScalars, "_change", recorded)
    sources = {"customer": str(tmp_path / "customer"), "orders": str(tmp_path / "orders")}
    create_source(spark, sources["customer"], CUSTOMER + [(7, 1), (8, 3)], "c_custkey BIGINT, c_nationkey BIGINT")
    create_source(spark, sources["orders"], ORDERS + [(16, 1, 2), (17, 1, 7)],
                  "o_orderkey BIGINT, o_custkey BIGINT, o_shippriority INT")
    views = {name: _view(spark, tmp_path, sources, name, sql) for name, sql in SCALARS.items()}
    assert "Filter (row-wise while its scalar subquery keeps its value: " in views["q22"].desired.strategy_description()
    orders, customer = sources["orders"], sources["customer"]
    _equal_through(spark, tmp_path, sources, views, SCALARS, [
        f"DELETE FROM delta.`{orders}` WHERE o_orderkey IN (13, 15)",
        f"UPDATE delta.`{customer}` SET c_nationkey = 1 WHERE c_custkey = 5",
        f"UPDATE delta.`{orders}` SET o_shippriority = 9, o_custkey = 2 WHERE o_orderkey = 16",
        f"INSERT INTO delta.`{orders}` VALUES (18, 4, 1), (19, 7, 2), (20, 8, 3)",
        f"DELETE FROM delta.`{customer}` WHERE c_nationkey = 1"])
    assert all(view.desired._operators is not None for view in views.values())
    assert set(ways) == {True, False}, ways  # only the operators' steps call the rule


def test_the_anti_joins_by_the_operators_alone(spark, tmp_path, operators_alone, strategies, monkeypatch):
    """The issue's anti-join aggregate (with a condition on the padded side, and plain) and a rollup of
    it, through orders gaining and losing a priority, deleted, and a customer moving nation; the
    touched keys held in Spark (as more than a local relation's would be)."""
    from mvsink.desired.operators import keys

    monkeypatch.setattr(keys, "LOCAL_MOST", 0)
    sources = {"customer": str(tmp_path / "customer"), "orders": str(tmp_path / "orders")}
    create_source(spark, sources["customer"], CUSTOMER, "c_custkey BIGINT, c_nationkey BIGINT")
    create_source(spark, sources["orders"], ORDERS, "o_orderkey BIGINT, o_custkey BIGINT, o_shippriority INT")
    views = {name: _view(spark, tmp_path, sources, name, ANTI_JOINS[name]) for name in ANTI_FORMS}
    orders = sources["orders"]
    _equal_through(spark, tmp_path, sources, views, ANTI_JOINS, [
        f"UPDATE delta.`{orders}` SET o_shippriority = o_shippriority + 1 WHERE o_orderkey IN (10, 11, 14)",
        f"DELETE FROM delta.`{orders}` WHERE o_orderkey IN (12, 13)",
        f"UPDATE delta.`{sources['customer']}` SET c_nationkey = 3 WHERE c_custkey = 2",
        f"DELETE FROM delta.`{orders}`"])
    assert set(strategies) == {"operators"}, strategies


def _equal_through(spark, base, sources, views: dict, sqls: dict, commits: list[str]) -> None:
    """Each of ``commits``, every view caught up after it; then each view (by name) equals its
    query of ``sqls`` at every time."""
    for commit in commits:
        spark.sql(commit)
        for view in views.values():
            view.run_until_caught_up()
    for name, view in views.items():
        query_results_at_every_time(spark, sources, sqls[name], {name: str(base / name)},
                                    str(base / name) + "_timeline", view.observed_upper)


def test_every_family_by_the_operators_alone(spark, tmp_path, operators_alone):
    """One random view of each family, two of them with a late replica, through three times of
    random commits: each equals the full evaluation at every time, maintained by the operators
    where they take it (the rest, such as a global aggregate on top, in full)."""
    case = random_case(FAMILIES_SEED, families=tuple(FAMILIES), times=3, late=2)
    outcome = Runner(spark, tmp_path).run(case)
    assert not outcome.failures, "\n\n".join(reproduction(case, f) for f in outcome.failures)
    by_operators = [i for i, taken in outcome.strategies.items() if taken == {"operators"}]
    assert len(by_operators) >= len(FAMILIES) - 3, outcome.strategies
    assert all(taken <= {"operators", "full evaluation (query)"} for taken in outcome.strategies.values())


def test_the_tester_fails_a_rule_broken_on_purpose(spark, tmp_path, operators_alone, monkeypatch):
    """A recompute by key whose rows removed are read after the step (as its rows added) leaves
    every retraction out: the dedup and outer-join views are reported as mismatches."""
    from mvsink.desired.operators import by_key
    from mvsink.desired.operators.base import Change

    intact = by_key.ByKey._change
    monkeypatch.setattr(by_key.ByKey, "_change", lambda self, step: Change(intact(self, step).plus,
                                                                           intact(self, step).plus))
    case = random_case(FAMILIES_SEED, families=("dedup", "outer_join"), times=3, late=0)
    outcome = Runner(spark, tmp_path).run(case)
    assert {f.view for f in outcome.failures if f.kind == "mismatch"} == {0, 1}, outcome.failures
    assert outcome.strategies == {0: {"operators"}, 1: {"operators"}}, outcome.strategies
