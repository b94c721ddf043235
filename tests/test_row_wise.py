"""Row-wise snapshot views (:mod:`mvsink.desired.row_wise`): which queries are row-wise, and that their
changes from the source's change feed are exactly the differences of the query's results."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pyspark.sql import functions as F

from helpers import (create_source, from_the_feed, insert, query_over_a_source,
                     query_results_at_every_time, random_commit, through_commits_without_feed)
from mvsink import MaterializedView, SnapshotInput, ViewDefinition, read_view, view_errors
from mvsink.desired import snapshot
from mvsink.desired.row_wise import HELD_ROWS, TABLE_SCAN, is_row_wise, passed_through

SCHEMA = "id BIGINT, grp STRING, amount DOUBLE, note STRING"
# Projections with expressions and a filter that rows enter and leave; nulls pass both.
QUERY = ("SELECT id, upper(grp) AS g, amount * 2 AS twice, coalesce(note, 'none') AS note FROM src "
         "WHERE amount IS NULL OR amount > 0.5")


@pytest.mark.parametrize("sql, row_wise", [
    ("SELECT * FROM src", True),
    (QUERY, True),
    ("SELECT id, grp FROM src WHERE id % 2 = 0 AND note LIKE 'n%'", True),
    ("SELECT grp, count(*) AS n FROM src GROUP BY grp", False),
    ("SELECT DISTINCT grp FROM src", False),
    ("SELECT a.id, b.grp FROM src a JOIN src b ON a.id = b.id + 1", False),
    ("SELECT id FROM src WHERE amount > (SELECT avg(amount) FROM src)", False),   # a scalar subquery
    ("SELECT id FROM src WHERE id IN (SELECT id + 1 FROM src)", False),
    ("SELECT id, rand() AS r FROM src", False),                                   # not deterministic
    ("SELECT * FROM src LIMIT 3", False),
    ("SELECT id, row_number() OVER (PARTITION BY grp ORDER BY id) AS n FROM src", False),
    ("SELECT id, explode(array(1, 2)) AS x FROM src", False),
    ("SELECT id FROM src UNION ALL SELECT id FROM src", False),
])
def test_which_queries_are_row_wise(spark, tmp_path, sql, row_wise):
    assert is_row_wise(query_over_a_source(spark, tmp_path, sql, (1, "a", 1.0, "n1"), SCHEMA), TABLE_SCAN) is row_wise


@pytest.mark.parametrize("sql, key, source_key", [
    ("SELECT id, grp FROM src WHERE amount > 0", ("id",), ("id",)),
    ("SELECT id AS k, grp FROM src", ("k",), ("id",)),                              # renamed
    ("SELECT grp, id FROM (SELECT * FROM src WHERE id > 0) WHERE grp = 'a'", ("id", "grp"), ("id", "grp")),
    ("SELECT id + 1 AS id, grp FROM src", ("id",), None),                           # computed
    ("SELECT CAST(id AS STRING) AS id FROM src", ("id",), None),
])
def test_which_key_columns_a_row_wise_query_passes_on_from_its_source(spark, tmp_path, sql, key, source_key):
    assert passed_through(query_over_a_source(spark, tmp_path, sql, (1, "a", 1.0, "n1"), SCHEMA), key) == source_key


def test_a_python_udf_or_a_query_reading_other_rows_is_not_row_wise(spark, tmp_path):
    src = str(tmp_path / "src")
    create_source(spark, src, [(1, "a", 1.0, "n1")], SCHEMA)
    source = spark.read.format("delta").load(src)
    assert not is_row_wise(source.select(F.udf(lambda v: v, "string")("grp")), TABLE_SCAN)
    held = source.localCheckpoint(eager=True)
    assert is_row_wise(held.where("id > 0"), HELD_ROWS)
    assert not is_row_wise(source.where("id > 0"), HELD_ROWS), "a query that ignores the rows it is given"


def _random_row(rng: random.Random, i: int) -> tuple:
    return (i, rng.choice(["a", "b", None]), rng.choice([None, 0.0, -0.0, 0.25, 0.75, 2.0]),
            rng.choice(["n", None, "x"]))


def _edit(spark, src: str, rng: random.Random, next_id: list[int]) -> None:
    """One source commit: an update moving rows across the filter, a delete, or inserts (with
    copies of rows already there, so that the keyless view holds duplicates)."""
    def inserts():
        rows = [_random_row(rng, next_id[0] + i) for i in range(rng.randint(1, 4))]
        next_id[0] += len(rows)
        return rows + rows[:1]

    random_commit(
        spark, src, rng,
        update=lambda: (f"UPDATE delta.`{src}` SET amount = CASE WHEN amount IS NULL THEN 0.75 WHEN amount > 0.5 "
                        f"THEN 0.25 ELSE NULL END, note = NULL WHERE pmod(id, {rng.randint(2, 4)}) = {rng.randint(0, 1)}"),
        delete=lambda: f"DELETE FROM delta.`{src}` WHERE pmod(id, 5) = {rng.randint(0, 4)}",
        inserts=inserts)


def _contents(spark, target: str, view_id: str, time: int) -> Counter:
    return Counter(tuple(r) for r in read_view(spark, target, view_id, time).collect())


@pytest.mark.parametrize("feed", [True, False], ids=["feed", "no-feed"])
def test_row_wise_changes_equal_the_differences_of_the_query_results(spark, tmp_path, feed):
    """A keyless view with its changes from the source's changes (row-wise: its change data
    feed, or without it its commits' files); several source commits per time, rows entering and
    leaving the filter, duplicates, nulls, -0.0, and a replica that catches up over many times at
    once. At every time it equals the query over the source's version."""
    rng = random.Random(9)
    src = str(tmp_path / "src")
    create_source(spark, src, [_random_row(rng, i) for i in range(30)], SCHEMA)
    if not feed:
        spark.sql(f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    next_id = [100]
    view = from_the_feed(spark, tmp_path, src, QUERY, lambda: _edit(spark, src, rng, next_id),
                                        rounds=6, rng=rng)
    assert view.desired.row_wise
    assert view.desired._previous is None, "a row-wise view keeps no result"


@pytest.mark.parametrize("deletion_vectors", [True, False], ids=["deletion-vectors", "files"])
def test_a_row_wise_view_over_versions_without_feed(spark, tmp_path, caplog, deletion_vectors):
    """Versions written with the change data feed off: the view reads their added and removed
    files, or where they wrote deletion vectors evaluates the query for those times instead (from
    the result before them); exactly, and it goes on row-wise."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, "a", 1.0, None) for i in range(10)], SCHEMA)
    view = MaterializedView(spark, ViewDefinition("v", tgt, SnapshotInput(sql=QUERY, refresh="incremental"),
                                                  key=("id",), sources={"src": src}, replica_id="r1"))
    view.run_until_caught_up()
    through_commits_without_feed(spark, view, src, caplog, f"UPDATE delta.`{src}` SET amount = 0.25 WHERE id < 3",
                                 lambda: insert(spark, src, [(20, "b", 2.0, "new")]), deletion_vectors)
    assert view.desired.row_wise and view.desired._previous is None
    query_results_at_every_time(spark, src, QUERY, {"v": tgt}, tgt + "_timeline", view.observed_upper)


def test_a_query_that_reads_its_source_itself_is_recomputed(spark, tmp_path):
    """A query function that ignores the rows it is given (it reads the source table itself) looks
    row-wise over the source but not over rows held in Spark: it is evaluated in full."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, "a", 1.0, None) for i in range(5)], SCHEMA)

    def reads_the_table(source):
        return source.sparkSession.read.format("delta").load(src).where("id > 1")

    view = MaterializedView(spark, ViewDefinition("v", tgt, SnapshotInput(src, reads_the_table), key=("id",),
                                                  replica_id="r1"))
    assert not view.desired.row_wise
    view.run_until_caught_up()
    insert(spark, src, [(7, "b", 2.0, "new")])
    view.run_until_caught_up()
    expected = Counter(tuple(r) for r in reads_the_table(spark.read.format("delta").load(src)).collect())
    assert _contents(spark, tgt, "v", view.observed_upper - 1) == expected


def _moves_across_the_filter(src: str, where: str) -> str:
    return f"UPDATE delta.`{src}` SET amount = CASE WHEN amount > 0.5 THEN 0.25 ELSE 0.75 END WHERE {where}"


def test_keys_passed_through_from_a_source_with_unique_keys_are_not_checked_and_repeats_are(spark, tmp_path):
    """A row-wise view keyed by a column it passes on from its source: while the source's key
    values are unique, rows entering and leaving the filter need no key check (the view has at
    most one row per source row); a source key that repeats is checked, its duplicate key error
    asserted and retracted (by an update moving the copy out of the view, then by a delete of
    it); once unique again, no check again, deletes included. At every time the view equals
    the query, rows and key errors."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, "a", 0.75 if i % 2 else 0.25, None) for i in range(10)], SCHEMA)
    view = MaterializedView(spark, ViewDefinition("v", tgt, SnapshotInput(sql=QUERY), key=("id",),
                                                  sources={"src": src}, replica_id="r1"))
    view.run_until_caught_up()
    assert view.desired._source_key == ("id",)

    def errors() -> list[str]:
        return [r[0] for r in view_errors(spark, tgt, view.observed_upper - 1).collect()]

    def step_after(sql: str) -> dict:
        spark.sql(sql)
        report = view.step()
        assert report.appended, report
        return report.spark_jobs

    for where in ("id < 4", "id >= 6"):  # rows enter and leave the filter; no source key repeats
        assert step_after(_moves_across_the_filter(src, where))["key_check"] == 0
    assert step_after(f"INSERT INTO delta.`{src}` VALUES (2, 'dup', 0.75, 'dup')")["key_check"] >= 1
    assert errors() == ['duplicate key {"id":2}: 2 rows'], errors()
    assert step_after(_moves_across_the_filter(src, "note = 'dup'"))["key_check"] >= 1  # id 2 repeats
    assert errors() == [], errors()
    step_after(_moves_across_the_filter(src, "note = 'dup'"))  # back in the view: id 2 twice again
    assert errors() == ['duplicate key {"id":2}: 2 rows'], errors()
    # Deleting the copy leaves the source's keys unique, and the violation ends in this step: checked.
    assert step_after(f"DELETE FROM delta.`{src}` WHERE note = 'dup'")["key_check"] >= 1
    assert errors() == [], errors()
    assert step_after(_moves_across_the_filter(src, "id < 3"))["key_check"] == 0  # unique again
    assert step_after(f"DELETE FROM delta.`{src}` WHERE id = 3")["key_check"] == 0  # deletes keep keys unique
    query_results_at_every_time(spark, src, QUERY, {"v": tgt}, tgt + "_timeline", view.observed_upper, ("id",))


@pytest.mark.parametrize("feed", [True, False], ids=["feed", "no-feed-not-small"])
def test_a_keyed_row_wise_view_equals_the_query_as_source_keys_repeat_and_stop(spark, tmp_path, monkeypatch, feed):
    """Random commits to a source keyed by ``id`` that mostly keeps its keys unique: updates moving
    rows across the filter, inserts repeating an id already there (some a copy of a row), deletes
    of whole ids. The view from the feed (its key checks skipped while the source's keys are
    unique) and the view recomputed in full (every key checked) equal the query at every time, rows
    and key errors. Without the change data feed and every change taken as not small, each change
    is consolidated as it is held (a rewritten file's kept rows cancelled, copies as rows of diff
    1 or -1)."""
    rng = random.Random(17)
    src = str(tmp_path / "src")
    create_source(spark, src, [_random_row(rng, i) for i in range(20)], SCHEMA)
    if not feed:
        spark.sql(f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
        monkeypatch.setattr(snapshot, "changes_are_small", lambda *_: False)

    def edit():
        random_commit(spark, src, rng,
                      update=lambda: _moves_across_the_filter(src, f"pmod(id, {rng.randint(2, 4)}) = {rng.randint(0, 1)}"),
                      delete=lambda: f"DELETE FROM delta.`{src}` WHERE id > 19 OR pmod(id, 7) = {rng.randint(0, 6)}",
                      inserts=lambda: [_random_row(rng, rng.randint(0, 19))])
        if rng.random() < 0.3:
            spark.sql(f"INSERT INTO delta.`{src}` SELECT * FROM delta.`{src}` WHERE id = {rng.randint(0, 19)}")

    view = from_the_feed(spark, tmp_path, src, QUERY, edit, rounds=8, rng=rng, key=("id",), recomputed=True)
    assert view.desired.row_wise and view.desired._source_key == ("id",)
