"""A source's changes from its Delta log (:mod:`mvsink.desired.log_changes`): each commit's change
data files (the change data feed on), else its added files at +1 and removed files at -1,
consolidated, are the difference of the source's snapshots before and after it, for every kind of
commit; where the files do not hold the table's rows (deletion vectors, a schema change) it says so
before reading any."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from helpers import insert, vacuum_all
from mvsink.desired.changes import unreadable
from mvsink.desired.log_changes import LogChangesUnavailable, log_changes
from mvsink.table import latest_version, log_actions
from mvsink.updates import DIFF, TIME

SCHEMA = "id BIGINT, part STRING, v INT"


def _source(spark, path: str, partitioned: bool, deletion_vectors: bool = False, feed: bool = False) -> None:
    spark.sql(f"CREATE TABLE delta.`{path}` ({SCHEMA}) USING delta {'PARTITIONED BY (part)' if partitioned else ''} "
              f"TBLPROPERTIES (delta.enableDeletionVectors = {str(deletion_vectors).lower()}, "
              f"delta.enableChangeDataFeed = {str(feed).lower()})")


def _snapshot(spark, path: str, version: int) -> Counter:
    return Counter(tuple(r) for r in spark.read.format("delta").option("versionAsOf", version).load(path).collect())


def _changes_by_version(spark, path: str, first: int, last: int, small: bool = False) -> dict[int, Counter]:
    """The log changes of each version ``first`` to ``last`` (its own time), consolidated; those
    read from data files (no change type) are so already, as rows of diff 1 or -1."""
    changes = log_changes(spark, path, [(v, v, v) for v in range(first, last + 1)], small)
    by_version: dict[int, Counter] = {v: Counter() for v in range(first, last + 1)}
    signs: dict[tuple, set[int]] = {}
    for row in changes.collect():
        by_version[row[TIME]][tuple(row[c] for c in ("id", "part", "v"))] += row[DIFF]
        signs.setdefault((row[TIME], *(row[c] for c in ("id", "part", "v"))), set()).add(row[DIFF])
    if not any("/_change_data/" in f for f in changes.inputFiles()):
        assert all(found in ({1}, {-1}) for found in signs.values()), signs
    return {v: _nonzero(c) for v, c in by_version.items()}


def _difference(before: Counter, after: Counter) -> Counter:
    """The rows ``after`` has more of (positive counts) and fewer of (negative), as a change is."""
    difference = Counter(after)
    difference.subtract(before)
    return _nonzero(difference)


def _nonzero(counts: Counter) -> Counter:
    """``counts`` without its zero counts, its negative ones kept (Counter's ``+``/``-`` drop them)."""
    return Counter({row: n for row, n in counts.items() if n})


def _random_commits(spark, path: str, rng: random.Random, commits: int) -> None:
    """Inserts with duplicates and null partitions, updates moving rows between partitions, deletes,
    a delete and re-insert in one MERGE, an overwrite of a partition, OPTIMIZE, a table property."""
    def rows(n):
        return [(rng.randint(0, 12), rng.choice(["a", "b", None]), rng.randint(0, 3)) for _ in range(n)]
    for _ in range(commits):
        kind = rng.choice(["insert", "update", "move", "delete", "merge", "overwrite", "optimize", "property"])
        if kind == "insert":
            insert(spark, path, rows(rng.randint(1, 5)))
        elif kind == "update":
            spark.sql(f"UPDATE delta.`{path}` SET v = v + 1 WHERE pmod(id, 3) = {rng.randint(0, 2)}")
        elif kind == "move":
            spark.sql(f"UPDATE delta.`{path}` SET part = CASE WHEN part = 'a' THEN 'b' ELSE 'a' END "
                      f"WHERE id < {rng.randint(2, 8)}")
        elif kind == "delete":
            spark.sql(f"DELETE FROM delta.`{path}` WHERE v = {rng.randint(0, 3)}")
        elif kind == "merge":  # every row of one id deleted and one of them inserted again, one commit
            spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT {rng.randint(0, 12)} AS id) s ON t.id = s.id "
                      "WHEN MATCHED THEN DELETE WHEN NOT MATCHED BY SOURCE AND t.id = 0 THEN UPDATE SET v = 9")
            insert(spark, path, rows(1))
        elif kind == "overwrite":
            spark.sql(f"INSERT INTO delta.`{path}` REPLACE WHERE part = 'a' "
                      f"SELECT id, part, v FROM delta.`{path}` WHERE part = 'a' AND id > 3")
        elif kind == "optimize":
            spark.sql(f"OPTIMIZE delta.`{path}`")
        else:
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (mvsink.test = '{rng.randint(0, 9)}')")


@pytest.mark.parametrize("partitioned, feed", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["unpartitioned", "partitioned", "unpartitioned-feed", "partitioned-feed"])
def test_each_commits_log_changes_are_the_difference_of_its_snapshots(spark, tmp_path, partitioned, feed):
    """With the change data feed on, the commits that rewrite rows (updates, deletes, MERGE) wrote
    change data files, and their changes are read from those. Without it, a rewrite's rows are
    consolidated as they are read (in one task or over a shuffle): the rows its files kept are
    not among them."""
    path = str(tmp_path / "src")
    _source(spark, path, partitioned, feed=feed)
    insert(spark, path, [(i, "ab"[i % 2], 0) for i in range(8)] + [(1, "a", 0), (2, None, 1)])
    _random_commits(spark, path, random.Random(5 + partitioned), commits=10)
    last = latest_version(path)
    cdc_commits = sum(any("cdc" in action for action in log_actions(path, v)) for v in range(1, last + 1))
    assert (cdc_commits > 0) == feed, cdc_commits
    read = log_changes(spark, path, [(v, v, v) for v in range(1, last + 1)]).inputFiles()
    assert any("/_change_data/" in f for f in read) == feed, read
    changes = _changes_by_version(spark, path, 1, last, small=partitioned)
    for version in range(1, last + 1):
        expected = _difference(_snapshot(spark, path, version - 1), _snapshot(spark, path, version))
        assert changes[version] == expected, f"version {version}"


def test_changes_of_several_commits_at_one_time_are_their_sum(spark, tmp_path):
    path = str(tmp_path / "src")
    _source(spark, path, partitioned=True)
    insert(spark, path, [(1, "a", 0), (2, "b", 0)])
    insert(spark, path, [(3, "a", 0)])
    spark.sql(f"UPDATE delta.`{path}` SET part = 'b' WHERE id = 1")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3")
    last = latest_version(path)
    rows = log_changes(spark, path, [(7, 2, last)]).collect()
    net = Counter()
    for row in rows:
        assert row[TIME] == 7
        net[(row["id"], row["part"], row["v"])] += row[DIFF]
    assert _nonzero(net) == _difference(_snapshot(spark, path, 1), _snapshot(spark, path, last))


def test_an_update_by_delta_rs_is_read_from_its_data_files_not_its_change_data(spark, tmp_path):
    """delta-rs's UPDATE leaves out of its change data every post-image equal to a row it matched
    and left as it was (here ``(3, 'a', 7)``): its change data alone would lose the two rows moved
    onto it. The change read is the difference of the snapshots all the same."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    path = str(tmp_path / "src")
    _source(spark, path, partitioned=False, feed=True)
    insert(spark, path, [(3, "a", 7), (4, "a", 7), (6, "a", 7), (1, "b", 1)])
    DeltaTable(path).update(updates={"id": "3"}, predicate="v = 7")
    last = latest_version(path)
    written = Counter()
    for action in log_actions(path, last):
        if "cdc" in action:
            for row in pq.read_table(f"{path}/{action['cdc']['path']}").to_pylist():
                written[(row["id"], row["part"], row["v"])] += 1 if row["_change_type"] == "update_postimage" else -1
    difference = _difference(_snapshot(spark, path, last - 1), _snapshot(spark, path, last))
    assert difference == Counter({(3, "a", 7): 2, (4, "a", 7): -1, (6, "a", 7): -1})
    assert _nonzero(written) != difference, "delta-rs's change data is whole now: the data files are not needed"
    assert _changes_by_version(spark, path, last, last)[last] == difference


def test_deletion_vectors_schema_changes_and_column_mapping_make_the_log_changes_unavailable(spark, tmp_path):
    with_vectors = str(tmp_path / "dv")
    _source(spark, with_vectors, partitioned=False, deletion_vectors=True)
    insert(spark, with_vectors, [(i, "a", 0) for i in range(10)])
    spark.sql(f"DELETE FROM delta.`{with_vectors}` WHERE id = 3")
    with pytest.raises(LogChangesUnavailable, match="version 2 .* deletion vector"):
        log_changes(spark, with_vectors, [(2, 2, 2)])
    widened = str(tmp_path / "schema")
    _source(spark, widened, partitioned=False)
    insert(spark, widened, [(1, "a", 0)])
    spark.sql(f"ALTER TABLE delta.`{widened}` ADD COLUMNS (w INT)")
    with pytest.raises(LogChangesUnavailable, match="schema of .* changes in versions 2..2"):
        log_changes(spark, widened, [(2, 2, 2)])
    mapped = str(tmp_path / "mapped")
    spark.sql(f"CREATE TABLE delta.`{mapped}` ({SCHEMA}) USING delta TBLPROPERTIES "
              "(delta.columnMapping.mode = 'name', delta.minReaderVersion = 2, delta.minWriterVersion = 5)")
    insert(spark, mapped, [(1, "a", 0)])
    with pytest.raises(LogChangesUnavailable, match="column mapping"):
        log_changes(spark, mapped, [(1, 1, 1)])


def test_a_range_written_under_a_column_mapping_removed_later_is_unavailable(spark, tmp_path):
    """Its files name their columns by the mapping's physical names: read by the table's names,
    every value would be null. The newest version has no mapping; the version before the range has."""
    path = str(tmp_path / "src")
    spark.sql(f"CREATE TABLE delta.`{path}` ({SCHEMA}) USING delta TBLPROPERTIES "
              "(delta.columnMapping.mode = 'name', delta.minReaderVersion = 2, delta.minWriterVersion = 5)")
    insert(spark, path, [(1, "a", 0)])
    insert(spark, path, [(2, "b", 1)])
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.columnMapping.mode' = 'none')")
    with pytest.raises(LogChangesUnavailable, match="column mapping at version 1"):
        log_changes(spark, path, [(2, 2, 2)])
    insert(spark, path, [(3, "c", 2)])
    after = latest_version(path)
    assert [tuple(r) for r in log_changes(spark, path, [(9, after, after)]).collect()] == [(3, "c", 2, 9, 1)]


def test_a_range_after_the_last_one_read_asks_delta_nothing_and_still_sees_metadata_move(spark, tmp_path,
                                                                                        monkeypatch):
    """The schema before a range that starts where the last one ended is known; a schema change or
    column mapping turned on in it is still refused, from the range's own commits."""
    from mvsink.desired import log_changes as module
    asked = []
    for name in ("_schema", "_column_mapping"):
        monkeypatch.setattr(module, name, lambda *args, _f=getattr(module, name), _n=name: asked.append(_n) or _f(*args))
    path = str(tmp_path / "src")
    _source(spark, path, partitioned=False)
    insert(spark, path, [(1, "a", 0)])
    log_changes(spark, path, [(1, 1, 1)]).collect()
    assert sorted(asked) == ["_column_mapping", "_schema"]  # version 0's, once
    asked.clear()
    insert(spark, path, [(2, "a", 0)])
    assert [tuple(r) for r in log_changes(spark, path, [(2, 2, 2)]).collect()] == [(2, "a", 0, 2, 1)]
    assert not asked
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
              "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')")
    with pytest.raises(LogChangesUnavailable, match="column mapping in versions 3..3"):
        log_changes(spark, path, [(3, 3, 3)])
    widened = str(tmp_path / "widened")
    _source(spark, widened, partitioned=False)
    insert(spark, widened, [(1, "a", 0)])
    asked.clear()
    log_changes(spark, widened, [(1, 1, 1)])
    spark.sql(f"ALTER TABLE delta.`{widened}` ADD COLUMNS (w INT)")
    with pytest.raises(LogChangesUnavailable, match="schema of .* changes in versions 2..2"):
        log_changes(spark, widened, [(2, 2, 2)])
    assert sorted(asked) == ["_column_mapping", "_schema"]  # only for the first range


def test_vacuumed_files_are_told_unreadable(spark, tmp_path):
    path = str(tmp_path / "src")
    _source(spark, path, partitioned=False)
    insert(spark, path, [(1, "a", 0)])
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 1")
    vacuum_all(spark, path)
    with pytest.raises(Exception) as gone:
        log_changes(spark, path, [(2, 2, 2)]).collect()
    assert unreadable(gone.value) is not None, str(gone.value)[:300]


def test_a_rewritten_files_kept_rows_cancel_and_nothing_else_changes():
    """A removed file and the added file of as many rows that rewrote it (an UPDATE: its rows in
    their order, a few changed) leave only the changed rows; without a column of unique values, a
    shuffled or unrelated file of as many rows and one of another count are left to grouping; with
    one (a key), a DELETE's and a MERGE's rewrites (rows dropped, order lost, a row added twice)
    leave only the changed rows too. In every case the rows at +1 less those at -1 are what they
    were (nulls equal to nulls, NaN never cancelled)."""
    import pyarrow as pa

    from mvsink.desired.log_changes import _cancel_kept_rows

    rng = random.Random(11)

    def table(rows):
        return pa.table({"id": pa.array([r[0] for r in rows], pa.int64()),
                         "s": pa.array([r[1] for r in rows], pa.string()),
                         "x": pa.array([r[2] for r in rows], pa.float64())})

    def random_rows(n):
        return [(rng.choice([None, *range(40)]), rng.choice([None, "a", "b"]), rng.choice([None, 0.5, float("nan")]))
                for _ in range(n)]

    def net(removed, added) -> Counter:
        counted = Counter()
        for diff, tables in ((-1, removed), (1, added)):
            for t in tables:
                for row in zip(*(t.column(c).to_pylist() for c in t.column_names)):
                    counted[tuple("nan" if v != v else v for v in row)] += diff
        return +counted - (-counted)

    original = random_rows(3000)
    changed_at = set(rng.sample(range(3000), 30))
    rewritten = [(r[0], "changed", r[2]) if i in changed_at else r for i, r in enumerate(original)]
    other = random_rows(500)
    shuffled = rng.sample(other, len(other))
    unrelated_removed, unrelated_added = random_rows(200), random_rows(200)
    grown = random_rows(100)
    removed = [table(other), table(unrelated_removed), table(original), table(grown)]
    added = [table(unrelated_added), table(rewritten), table(shuffled), table(grown + random_rows(1))]
    left_removed, left_added = _cancel_kept_rows(removed, added)
    assert net(left_removed, left_added) == net(removed, added)
    nan_kept = sum(1 for i in range(3000) if i not in changed_at and original[i][2] != original[i][2])
    assert left_removed[2].num_rows == left_added[1].num_rows == len(changed_at) + nan_kept
    assert left_removed[3].num_rows == 100 and left_added[3].num_rows == 101

    keyed = [(i, rng.choice([None, "a", "b"]), rng.choice([None, 0.5])) for i in range(4000)]
    touched = {i for i in changed_at if i < 2000}
    deleted = [r for i, r in enumerate(keyed[:2000]) if i not in touched]  # a DELETE
    merged = rng.sample([(r[0], "changed", r[2]) if r[0] - 2000 in touched else r for r in keyed[2000:]], 2000)
    merged.append(keyed[2500])  # a row kept and inserted again: one copy cancels, one is added
    removed, added = [table(keyed[:2000]), table(keyed[2000:])], [table(deleted), table(merged)]
    left_removed, left_added = _cancel_kept_rows(removed, added)
    assert net(left_removed, left_added) == net(removed, added)
    assert sum(t.num_rows for t in left_removed) == 2 * len(touched)
    assert sum(t.num_rows for t in left_added) == len(touched) + 1
