"""Per-group aggregates (:mod:`mvsink.desired.per_group`): which queries are, and that their changes
(the groups the source's changes touch, recomputed before and after) are exactly the differences of
the query's results (min, max, distinct counts and averages of decimals together, duplicate rows,
null groups and values, groups that appear, empty and reappear, rows moving between groups,
versions without change data feed), beside the same view evaluated in full; that a step reads only
the changed groups' files; and the strategy the view reports, explains and is refused without."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from helpers import (create_source, from_the_feed, insert, query_over_a_source,
                     query_results_at_every_time, random_commit, through_commits_without_feed)
from mvsink import MaterializedView, SnapshotInput, ViewDefinition
from mvsink.desired.per_group import PerGroup, per_group
from mvsink.desired.row_wise import TABLE_SCAN

SCHEMA = "id BIGINT, grp STRING, sub INT, qty INT, weight DECIMAL(10,2)"
QUERY = ("SELECT grp AS g, sub, min(qty) AS lo, max(weight) AS hi, count(DISTINCT qty) AS kinds, "
         "avg(weight) AS mean, count(*) AS n FROM src WHERE id % 7 <> 3 GROUP BY grp, sub")
HAVING = "SELECT grp, max(weight) AS hi FROM src GROUP BY grp HAVING count(*) > 2"
STRATEGY = "per-group recompute"


@pytest.fixture
def in_spark(monkeypatch):
    """The changed groups recomputed in Spark from the sources (their input not held in the driver,
    :mod:`mvsink.desired.arrow_recompute`): what a step of Spark's reads."""
    from mvsink.desired.snapshot import SnapshotDesired

    monkeypatch.setattr(SnapshotDesired, "_recompute_in_process", lambda self, *args: None)


@pytest.mark.parametrize("sql, columns", [
    (QUERY, ("grp", "sub")),
    ("SELECT grp, max(qty) + 1 AS m FROM src GROUP BY grp", ("grp",)),   # an expression of an aggregate
    (HAVING, ("grp",)),
    ("SELECT DISTINCT sub, grp FROM src", ("sub", "grp")),
    ("SELECT grp, sum(weight) AS w, max(qty) AS m FROM src GROUP BY grp", ("grp",)),   # an exact sum
    ("SELECT grp, sum(CAST(weight AS DOUBLE)) AS w, max(qty) AS m FROM src GROUP BY grp", None),  # float sum
    ("SELECT grp, avg(CAST(weight AS DOUBLE)) AS w FROM src GROUP BY grp", None),
    ("SELECT grp, stddev(weight) AS s FROM src GROUP BY grp", None),             # computed in doubles
    ("SELECT upper(grp) AS g, max(qty) AS m FROM src GROUP BY upper(grp)", None),  # a computed group
    ("SELECT max(qty) AS m FROM src", None),                                     # one row even when empty
    ("SELECT grp, first(qty) AS f FROM src GROUP BY grp", None),                  # order-dependent
    ("SELECT grp, collect_list(qty) AS l FROM src GROUP BY grp", None),
    ("SELECT grp, max(qty) AS m FROM src WHERE rand() > 0.5 GROUP BY grp", None),
    ("SELECT grp, max(qty) AS m FROM src WHERE qty > (SELECT avg(qty) FROM src) GROUP BY grp", None),
    ("SELECT grp, count(DISTINCT qty) AS a, count(DISTINCT sub) AS b FROM src GROUP BY grp", None),  # Expand
    ("SELECT grp, max(n) AS m FROM (SELECT grp, sub, count(*) AS n FROM src GROUP BY grp, sub) GROUP BY grp", None),
    # Read twice, its reads named apart (mvsink.desired.occurrences): over the sources an aggregate of a join.
    ("SELECT a.grp, max(a.qty) AS m FROM src a JOIN src b ON a.id = b.id GROUP BY a.grp", ("grp",)),
], ids=["query", "expression", "having", "distinct", "decimal-sum", "double-sum", "double-avg", "stddev",
         "computed-group", "no-group-by", "first",
        "collect-list", "rand", "subquery", "two-distinct", "nested", "self-join"])
def test_which_queries_are_per_group_aggregates(spark, tmp_path, sql, columns):
    query = query_over_a_source(spark, tmp_path, sql, (1, "a", 1, 2, 0.5), SCHEMA)
    twice = " JOIN src b" in sql
    assert per_group(query, TABLE_SCAN) == (PerGroup({"source 1": columns}, ("source 2",) if twice else (), (0,) if twice else ())
                                           if columns else None)


def test_a_linear_aggregate_keeps_its_strategy(spark, tmp_path):
    src = str(tmp_path / "src")
    create_source(spark, src, [(1, "a", 1, 2, 0.5)], SCHEMA)
    view = MaterializedView(spark, ViewDefinition("v", str(tmp_path / "v"), SnapshotInput(
        sql="SELECT grp, count(*) AS n, sum(qty) AS q FROM src GROUP BY grp"), sources={"src": src}, replica_id="r1"))
    assert view.desired.aggregate is not None and view.desired.per_group is None


def _row(rng: random.Random, i: int) -> tuple:
    return (i, rng.choice(["a", "b", "c", None]), rng.choice([1, 2, None]), rng.choice([None, 0, 1, 5, -3]),
            rng.choice([None, 0.5, 1.25, -2.0, 3.75]))


def _edit(spark, src: str, rng: random.Random, next_id: list[int]) -> None:
    """One source commit: values set to null or changed and rows moving to another group (or
    back), a delete (which can empty a group, 'd' always), or inserts (which can start one; with
    duplicates of one row)."""
    def inserts():
        rows = [_row(rng, next_id[0] + i) for i in range(rng.randint(1, 5))]
        next_id[0] += len(rows)
        return rows + rows[:rng.randint(0, 2)]

    random_commit(
        spark, src, rng,
        update=lambda: (f"UPDATE delta.`{src}` SET qty = CASE WHEN qty IS NULL THEN 4 ELSE NULL END, "
                        f"weight = CASE WHEN weight IS NULL THEN 0.75 WHEN weight > 1 THEN NULL ELSE weight + 1 END, "
                        f"grp = CASE WHEN id % 3 = 0 THEN 'd' WHEN grp IS NULL THEN 'a' ELSE grp END "
                        f"WHERE pmod(id, {rng.randint(2, 5)}) = {rng.randint(0, 1)}"),
        delete=lambda: f"DELETE FROM delta.`{src}` WHERE pmod(id, 4) = {rng.randint(0, 3)} OR grp = 'd'",
        inserts=inserts)


@pytest.mark.parametrize("sql, key, feed", [
    (QUERY, (), True),
    (QUERY, ("g", "sub"), True),     # the grouping columns: groups with a null are errors
    (QUERY, ("sub",), True),         # part of them: keys with several rows, appearing and ending
    (HAVING, (), True),              # groups that pass the HAVING and stop passing it
    (QUERY, (), False),              # a source without change data feed: its commits' files
], ids=["keyless", "key-groups", "key-part", "having", "no-feed"])
def test_per_group_changes_equal_the_differences_of_the_query_results(spark, tmp_path, strategies, sql, key, feed):
    """The view recomputed per group, several commits per time, and (keyed by part of the groups,
    or without change data feed) a replica that catches up over many times at once: its commits equal the query over the source's version at every time,
    and every range of changes is computed per group."""
    rng = random.Random(25)
    src = str(tmp_path / "src")
    create_source(spark, src, [_row(rng, i) for i in range(40)], SCHEMA)
    if not feed:
        spark.sql(f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    next_id = [100]
    view = from_the_feed(spark, tmp_path, src, sql, lambda: _edit(spark, src, rng, next_id),
                         rounds=4, rng=rng, key=key, late=key == ("sub",) or not feed)
    assert view.desired.per_group is not None and view.desired._previous is None
    assert strategies and set(strategies) == {STRATEGY}, strategies


def test_groups_that_appear_empty_and_reappear_and_rows_that_move(spark, tmp_path, strategies):
    """A group starts, loses its last row (its row is gone), comes back; a row moves to another
    group and to the null group; duplicates come and go one at a time."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a", 1, 2, 0.5), (2, "b", 1, 3, None)], SCHEMA)
    view = MaterializedView(spark, ViewDefinition("v", tgt, SnapshotInput(sql=QUERY, refresh="incremental"),
                                                  sources={"src": src},
                                                  replica_id="r1"))
    view.run_until_caught_up()
    for commit in [lambda: insert(spark, src, [(4, "c", 2, 1, 1.25), (4, "c", 2, 1, 1.25)]),
                   lambda: spark.sql(f"DELETE FROM delta.`{src}` WHERE grp = 'c'"),
                   lambda: insert(spark, src, [(5, "c", 2, None, None)]),
                   lambda: spark.sql(f"UPDATE delta.`{src}` SET grp = 'b' WHERE id = 1"),
                   lambda: spark.sql(f"UPDATE delta.`{src}` SET grp = NULL, sub = NULL WHERE id = 2"),
                   lambda: insert(spark, src, [(2, None, None, 3, 0.25), (8, "a", 1, 7, -1.5)])]:
        commit()
        view.run_until_caught_up()
    assert view.observed_upper >= 7
    query_results_at_every_time(spark, src, QUERY, {"v": tgt}, tgt + "_timeline", view.observed_upper)
    assert set(strategies) == {STRATEGY}, strategies


@pytest.mark.parametrize("deletion_vectors", [True, False], ids=["deletion-vectors", "files"])
def test_a_per_group_aggregate_over_versions_without_feed(spark, tmp_path, caplog, strategies, deletion_vectors):
    """Versions written with the change data feed off: the view recomputes the groups of their
    added and removed files, or where they wrote deletion vectors evaluates the query for them in
    full; exactly, and then goes on per group."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, "ab"[i % 2], 1, i, i / 4) for i in range(10)], SCHEMA)
    view = MaterializedView(spark, ViewDefinition("v", tgt, SnapshotInput(sql=QUERY, refresh="incremental"),
                                                  key=("g", "sub"),
                                                  sources={"src": src}, replica_id="r1"))
    view.run_until_caught_up()
    through_commits_without_feed(spark, view, src, caplog, f"UPDATE delta.`{src}` SET qty = 100 WHERE id < 3",
                                 lambda: (insert(spark, src, [(20, "c", 1, 7, None)]),
                                          spark.sql(f"DELETE FROM delta.`{src}` WHERE grp = 'a'")),
                                 deletion_vectors)
    assert view.desired.per_group is not None and view.desired._previous is None
    assert ("full evaluation" in strategies) == deletion_vectors and strategies[-1] == STRATEGY, strategies
    query_results_at_every_time(spark, src, QUERY, {"v": tgt}, tgt + "_timeline", view.observed_upper)


def test_a_step_reads_only_the_changed_groups_files(spark, tmp_path, in_spark):
    """A source laid out in 8 files by its group column, the groups recomputed in Spark: a change of two groups reads the file
    holding them (and the insert's files) at each version, a change of the null group the file
    holding nulls; the view equals the query at every time."""
    sql = "SELECT sub, max(weight) AS hi, count(DISTINCT qty) AS kinds FROM src GROUP BY sub"
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, schema=SCHEMA)
    rows = [(i, "a", i // 2 + 1, i % 3, Decimal(i) / 4) for i in range(160)] + [(500, "a", None, 1, Decimal("0.5"))]
    spark.createDataFrame(rows, SCHEMA).repartitionByRange(8, "sub").write.format("delta").mode("append").save(src)
    view = MaterializedView(spark, ViewDefinition("v", tgt, SnapshotInput(sql=sql, refresh="incremental"),
                                                  sources={"src": src},
                                                  replica_id="r1"))
    view.run_until_caught_up()

    def reads(rows: list[tuple]) -> tuple[int, int]:
        """The old files the step reads at the version before and after the insert of ``rows``
        (after: less the insert's own files, all read)."""
        insert(spark, src, rows)
        reports = [view.step() for _ in range(3)]
        assert {r.strategy for r in reports if r.reads} == {STRATEGY}
        (before, after) = sorted((r.total_files, r.files) for report in reports for r in report.reads
                                 if r.table == "src")
        return before[1], after[1] - (after[0] - before[0])

    assert reads([(600, "a", 79, 9, 2.0), (601, "a", 80, 9, 0.25)]) == (1, 1), "the last file"
    assert reads([(602, "a", None, 9, 2.0)]) == (1, 1), "the null group's file"
    spark.sql(f"DELETE FROM delta.`{src}` WHERE sub = 79")
    view.run_until_caught_up()
    query_results_at_every_time(spark, src, sql, {"v": tgt}, tgt + "_timeline", view.observed_upper)


def test_string_groups_are_read_through_deltas_data_skipping(spark, tmp_path, in_spark):
    """Groups by a string column, laid out in 8 files by it: the listed files cannot prune strings
    (truncated statistics), so the step reads through Delta, which prunes them by prefix: a change
    of one group reads its file at the version before (1 of 8), not every file."""
    sql = "SELECT name, max(qty) AS hi FROM src GROUP BY name"
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    spark.createDataFrame([(i, f"g{i // 10:02d}", i % 7) for i in range(80)], "id INT, name STRING, qty INT") \
        .repartitionByRange(8, "name").write.format("delta").option("delta.enableChangeDataFeed", "true").save(src)
    view = MaterializedView(spark, ViewDefinition("v", tgt, SnapshotInput(sql=sql, refresh="incremental"),
                                                  sources={"src": src}, replica_id="r1"))
    view.run_until_caught_up()
    insert(spark, src, [(500, "g03", 99)])
    reads = [(r.files, r.total_files) for report in [view.step() for _ in range(3)] for r in report.reads]
    assert (1, 8) in reads and not any(files == total for files, total in reads), reads
    query_results_at_every_time(spark, src, sql, {"v": tgt}, tgt + "_timeline", view.observed_upper)


def test_refresh_incremental_accepts_it_and_explain_says_so(spark, tmp_path, capsys):
    """``incremental`` takes a per-group aggregate, still refuses an aggregate it cannot maintain
    (naming it), ``full`` evaluates it in full; ``mvsink explain`` prints the strategy."""
    from mvsink.replica import cli
    from mvsink.view import ConfigError

    src = str(tmp_path / "src")
    create_source(spark, src, [(1, "a", 1, 2, 0.5)], SCHEMA)

    def view(sql: str, refresh: str) -> MaterializedView:
        return MaterializedView(spark, ViewDefinition("v", str(tmp_path / refresh), SnapshotInput(
            sql=sql, refresh=refresh), sources={"src": src}, replica_id="r1"))

    assert view(QUERY, "incremental").desired.per_group is not None
    assert view(QUERY, "full").desired.per_group is None
    with pytest.raises(ConfigError, match="refresh incremental.*depends on the order of its rows \(first\)"):
        view("SELECT grp, first(qty) AS f FROM src GROUP BY grp", "incremental")
    config = tmp_path / "view.yaml"
    config.write_text(f"view_id: v\ntarget: target\nsources: {{src: src}}\n"
                      f"input:\n  kind: snapshot\n  refresh: incremental\n  sql: \"{QUERY}\"\n")
    code = cli.main(["explain", str(config)])
    out = capsys.readouterr().out
    assert code == 0 and "its query is an aggregate of one source grouped by its columns" in out, out
    assert "(grp, sub)" in out, out


@pytest.mark.parametrize("sql, strategy", [
    ("SELECT sub, max(qty) AS top, count(*) AS n FROM src GROUP BY sub", STRATEGY),
    ("SELECT sub, sum(qty) AS top, count(*) AS n FROM src GROUP BY sub", "linear aggregate"),
    ("SELECT sub, max(lpad(CAST(qty AS STRING), 6, '0')) AS top, count(*) AS n FROM src GROUP BY sub", STRATEGY),
], ids=["per-group", "linear-aggregate", "string-key"])
def test_the_key_check_reads_only_the_files_that_can_hold_the_touched_keys(spark, tmp_path, monkeypatch, strategies,
                                                                            in_spark, sql, strategy):
    """Keyed by an aggregate (two groups with one maximum, or sum, are a duplicate key; a number,
    or a string whose statistics are plainly values): each step that starts or ends a group
    checks the keys whose row count changed, reading only the view's files whose statistics of
    the key can hold them (the buffer's rows are read whole). Duplicates started and ended against
    rows of an old file and of the hydration's are found; the view's rows and key errors equal the
    query's at every time."""
    from mvsink.correction.readback import ReadBack

    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, "a", i, i * 10, Decimal(1)) for i in range(40)], SCHEMA)
    view = MaterializedView(spark, ViewDefinition("v", tgt, SnapshotInput(sql=sql, refresh="incremental"),
                                                  key=("top",), sources={"src": src}, replica_id="r1"))
    view.run_until_caught_up()
    reads = []
    contents = ReadBack.contents
    monkeypatch.setattr(ReadBack, "contents", lambda self, files=None: (
        reads.append((len([f for f in (self.files if files is None else files) if not f.startswith("_mv_errors")]),
                      len([f for f in self.files if not f.startswith("_mv_errors")]))),
        contents(self, files))[1])
    insert(spark, src, [(100 + i, "a", 100 + i, 1000 + i * 10, Decimal(1)) for i in range(10)])  # new groups
    view.run_until_caught_up()
    insert(spark, src, [(200, "a", 200, 1000, Decimal(1))])  # a duplicate of a new group's key
    view.run_until_caught_up()
    insert(spark, src, [(201, "a", 201, 50, Decimal(1))])  # a duplicate of a hydrated group's key
    view.run_until_caught_up()
    for sub in (100, 5):  # each duplicate ends
        spark.sql(f"DELETE FROM delta.`{src}` WHERE sub = {sub}")
        view.run_until_caught_up()
    assert len(reads) >= 5 and all(read < total for read, total in reads), reads
    assert set(strategies) == {strategy}, strategies
    query_results_at_every_time(spark, src, sql, {"v": tgt}, tgt + "_timeline", view.observed_upper, ("top",))
