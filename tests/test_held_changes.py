"""A step's input changes as the buffer takes them (:func:`mvsink.desired.changes.held_changes`): consolidated,
counted, and whether some key's row count changes, all from one Spark job, each equal to what
computing it directly in Python over the same updates gives, whether they are shuffled by the key
or gathered into one task; and the change feed's size from the Delta log that picks one task
(:func:`mvsink.desired.changes.feed_is_small`)."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import pytest
from pyspark.sql import types as T

from mvsink.desired.changes import ONE_TASK_BYTES, feed_is_small, held_changes
from mvsink.table import change_data_bytes, log_actions

SCHEMA = T.StructType([
    T.StructField("k", T.LongType()), T.StructField("j", T.StringType()), T.StructField("v", T.StringType()),
    T.StructField("_mv_error", T.StringType()), T.StructField("_mv_time", T.LongType()),
    T.StructField("_mv_diff", T.LongType()),
])


def expected(rows, key):
    """Consolidated updates, and whether some (key, time) of ok rows with no null key nets to non-zero."""
    sums = Counter()
    for *row, diff in rows:
        sums[tuple(row)] += diff
    consolidated = Counter({row: d for row, d in sums.items() if d})
    net = defaultdict(int)
    for (k, j, v, error, time), diff in sums.items():
        keys = {"k": k, "j": j}
        if error is None and all(keys[c] is not None for c in key):
            net[tuple(keys[c] for c in key) + (time,)] += diff
    return consolidated, any(net.values())


def updates_in_place(rng, n):
    """Rows replaced in place (-old, +new on the same key and time): no count changes."""
    rows = []
    for k in rng.sample(range(1000), n):
        time = rng.randint(3, 5)
        rows += [(k, "a", f"old{k}", None, time, -1), (k, "a", f"new{k}", None, time, 1)]
    return rows


CASES = {
    "updates in place": lambda rng: updates_in_place(rng, 50),
    "an update that changes nothing": lambda rng: updates_in_place(rng, 20) + [(7, "a", "x", None, 3, -1),
                                                                             (7, "a", "x", None, 3, 1)],
    "one insert among updates": lambda rng: updates_in_place(rng, 50) + [(5000, "a", "x", None, 4, 1)],
    "one delete among updates": lambda rng: updates_in_place(rng, 50) + [(5000, "a", "x", None, 5, -1)],
    "a key moved to another time": lambda rng: [(1, "a", "x", None, 3, -1), (1, "a", "y", None, 4, 1)],
    "a row changing key": lambda rng: [(1, "a", "x", None, 3, -1), (2, "a", "x", None, 3, 1)],
    "duplicate rows": lambda rng: [(1, "a", "x", None, 3, 1), (1, "a", "x", None, 3, 1), (1, "a", "x", None, 3, -2)],
    "error updates only": lambda rng: [(None, None, None, "bad row", 3, 1), (1, None, None, "duplicate key", 3, 1)],
    "null keys": lambda rng: [(None, "a", "x", None, 3, 1), (None, "b", "y", None, 3, -1)],
    "nothing left": lambda rng: [(1, "a", "x", None, 3, 1), (1, "a", "x", None, 3, -1)],
    "random": lambda rng: [(rng.randint(0, 20), rng.choice(["a", "b", None]), rng.choice(["x", "y"]),
                            rng.choice([None, None, None, "err"]), rng.randint(3, 5), rng.choice([-1, 1]))
                           for _ in range(400)],
}


@pytest.mark.parametrize("one_task", [False, True], ids=["shuffled by key", "one task"])
@pytest.mark.parametrize("key", [("k",), ("k", "j")], ids=["one key column", "two key columns"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_held_changes_are_the_updates_consolidated_with_their_count_and_key_change(spark, case, key, one_task):
    rng = random.Random(case)
    rows = CASES[case](rng)
    rng.shuffle(rows)
    changes = held_changes(spark.createDataFrame(rows, SCHEMA).repartition(3), 3, key, one_task=one_task)
    if one_task:
        assert changes.updates.rdd.getNumPartitions() == 1
    want, counts_change = expected(rows, key)
    got = Counter({tuple(r[:-1]): r[-1] for r in changes.updates.collect()})
    assert got == want
    assert changes.updates.count() == len(want)  # one update per row and time
    assert changes.size == len(want)
    assert changes.key_counts_change is counts_change
    assert changes.lo == 3
    if counts_change:  # the ranges the key check prunes the view's files by cover every touched key
        ranges, nulls = changes.touched_ranges
        for row in changes.touched.collect():
            value = row[key[0]]
            assert nulls if value is None else any(low <= value <= high for low, high in ranges), (value, ranges)


@pytest.mark.parametrize("one_task", [False, True], ids=["shuffled", "one task"])
def test_held_changes_of_a_keyless_view_say_nothing_of_keys(spark, one_task):
    rows = [(1, "a", "x", None, 3, 1), (1, "a", "x", None, 3, 1), (2, "a", "y", None, 4, -1)]
    changes = held_changes(spark.createDataFrame(rows, SCHEMA).repartition(2), 3, (), one_task=one_task)
    assert Counter({tuple(r[:-1]): r[-1] for r in changes.updates.collect()}) == expected(rows, ())[0]
    assert changes.size == 2 and changes.key_counts_change is None


def test_the_change_feed_is_sized_from_the_log(spark, tmp_path):
    """Per commit its change data files, or without them its added and removed files; None past
    the commits it may read or where a commit file is gone."""
    src = str(tmp_path / "src")
    spark.range(2000).selectExpr("id", "id % 7 AS v").write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(src)
    spark.sql(f"UPDATE delta.`{src}` SET v = v + 1 WHERE id % 10 = 0")  # version 1: change data files
    spark.range(2000, 2100).selectExpr("id", "id % 7 AS v").write.format("delta").mode("append").save(src)  # 2: adds

    def sizes(version, action):
        return sum(a[action]["size"] for a in log_actions(src, version) if action in a)

    assert sizes(1, "cdc") > 0
    assert change_data_bytes(src, 1, 1, most=16) == sizes(1, "cdc")
    assert change_data_bytes(src, 2, 2, most=16) == sizes(2, "add") > 0
    assert change_data_bytes(src, 1, 2, most=16) == sizes(1, "cdc") + sizes(2, "add")
    assert change_data_bytes(src, 0, 2, most=2) is None
    assert feed_is_small(src, 1, 2) and sizes(1, "cdc") + sizes(2, "add") <= ONE_TASK_BYTES
    (tmp_path / "src" / "_delta_log" / f"{1:020d}.json").unlink()
    assert change_data_bytes(src, 1, 2, most=16) is None
    assert not feed_is_small(src, 1, 2)
