"""The hydration's question, every key once with diff 1 (:func:`mvsink.desired.key_check.unique_keys`):
settled within partitions where their key ranges are disjoint, else by a shuffle; both answer as
counting every key over all rows would."""

from __future__ import annotations

import datetime
import random
from collections import Counter

import pytest
from pyspark.sql import types as T

from mvsink.desired.key_check import KeyRanges, unique_keys, unique_keys_in_partitions
from mvsink.mint import Description
from mvsink.write import stage


def frame(spark, partitions: list[list[tuple]], key_type: T.DataType):
    """Updates (key, value, diff), each inner list one Spark partition, in that order."""
    schema = T.StructType([T.StructField("k", key_type), T.StructField("v", T.StringType()),
                           T.StructField("_mv_diff", T.LongType())])
    rows = [row for part in partitions for row in part]
    sizes = [len(p) for p in partitions]

    def slice_of(index, _rows):
        start = sum(sizes[:index])
        return iter(rows[start:start + sizes[index]])

    rdd = spark.sparkContext.parallelize(range(len(partitions)), len(partitions)).mapPartitionsWithIndex(slice_of)
    return spark.createDataFrame(rdd, schema)


def expected(partitions: list[list[tuple]]) -> tuple[int, bool]:
    rows = [row for part in partitions for row in part]
    keys = Counter(0.0 if row[0] == 0 and isinstance(row[0], float) else row[0] for row in rows)
    return len(rows), all(n == 1 for n in keys.values()) and all(row[2] == 1 for row in rows)


def up(*keys, diff=1):
    return [(k, f"v{k}", diff) for k in keys]


DAY = datetime.date(2024, 1, 1)
CASES = {
    # name: (partitions, key type, settled within partitions?)
    "ordered ids": ([up(1, 2, 3), up(4, 5), up(9, 10)], T.LongType(), True),
    "repeat in a partition": ([up(1, 2, 2), up(4, 5)], T.LongType(), True),
    "overlapping, unique": ([up(1, 5), up(2, 6), up(3)], T.LongType(), False),
    "overlapping, repeat across": ([up(1, 5), up(5, 6)], T.LongType(), False),
    "touching ranges repeat": ([up(1, 3), up(3, 4)], T.LongType(), False),
    "one null key": ([up(None, 1), up(2, 3)], T.LongType(), True),
    "two null keys apart": ([up(None, 1), up(None, 3)], T.LongType(), True),
    "diff 2": ([up(1, 2), up(3, diff=2)], T.LongType(), True),
    "strings": ([up("a", "b"), up("ba", "c"), up("é")], T.StringType(), True),
    "strings repeat across": ([up("a", "c"), up("b", "c")], T.StringType(), False),
    "dates": ([up(DAY, DAY + datetime.timedelta(1)), up(DAY + datetime.timedelta(2))], T.DateType(), True),
    "timestamps ordered": ([up(datetime.datetime(2024, 1, 1, 5)), up(datetime.datetime(2024, 1, 1, 5, 0, 1))],
                           T.TimestampType(), True),
    "timestamps repeat across": ([up(datetime.datetime(2024, 1, 1, 5)), up(datetime.datetime(2024, 1, 1, 5))],
                                 T.TimestampType(), False),
    "floats -0.0 and 0.0": ([up(-0.0), up(0.0)], T.DoubleType(), None),
    "empty": ([[], []], T.LongType(), True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_unique_keys_answers_as_counting_all_keys(spark, name):
    partitions, key_type, settled = CASES[name]
    updates = frame(spark, partitions, key_type)
    assert unique_keys(updates, ("k",)) == expected(partitions)
    in_partitions = unique_keys_in_partitions(updates, ("k",))
    if settled:
        assert in_partitions == expected(partitions)
    else:
        assert in_partitions is None  # left to the shuffle


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_staging_reports_the_same_key_ranges(spark, tmp_path, name):
    """The files staged from the updates, each a partition, settle what the partitions' own
    reports settle: a hydration's key check can ride on its staging."""
    partitions, key_type, _ = CASES[name]
    updates = frame(spark, partitions, key_type)
    ranges = KeyRanges.of(updates, ("k",))
    if ranges is None:
        assert unique_keys_in_partitions(updates, ("k",)) is None
        return
    batch = stage(updates, Description(0, 1), str(tmp_path), "v", "r", ranges)
    assert len(batch.key_reports) == len(batch.files) == sum(1 for p in partitions if p)
    assert ranges.settle(batch.key_reports) == unique_keys_in_partitions(updates, ("k",))
    assert stage(updates, Description(0, 1), str(tmp_path), "v", "r").key_reports == []


def test_multi_column_keys_go_to_the_shuffle(spark):
    updates = frame(spark, [up(1, 2), up(3)], T.LongType())
    assert unique_keys_in_partitions(updates, ("k", "v")) is None
    assert unique_keys(updates, ("k", "v")) == (3, True)


def test_random_partitionings(spark):
    rng = random.Random(7)
    for _ in range(12):
        keys = rng.sample(range(40), rng.randint(1, 30))
        if rng.random() < 0.5:
            keys.sort()
        if rng.random() < 0.3:
            keys.append(rng.choice(keys))
        cuts = sorted(rng.sample(range(1, len(keys) + 1), min(len(keys), rng.randint(1, 4)) - 1)) if len(keys) > 1 else []
        bounds = [0] + cuts + [len(keys)]
        partitions = [up(*keys[a:b]) for a, b in zip(bounds, bounds[1:])]
        diff_two = rng.random() < 0.1
        if diff_two:
            partitions[-1] = partitions[-1] + up(100, diff=2)
        assert unique_keys(frame(spark, partitions, T.LongType()), ("k",)) == expected(partitions), partitions
