"""A source read from the files listed by delta-rs (:mod:`mvsink.desired.listed_files`), as a join's
other side or a per-group aggregate's groups are: the files whose statistics can hold a key of the
ranges (or a null, where asked), exactly the rows Delta reads there, and tables that are not plain
Parquet left to Delta."""

import datetime
from decimal import Decimal

from pyspark.sql import functions as F

from mvsink.desired.join import pruned
from mvsink.desired.listed_files import add_actions, files_in_ranges, read_files

SCHEMA = "id BIGINT, day DATE, price DECIMAL(10,2), name STRING"


def _table(spark, path: str, files: int = 4, properties: str = "delta.enableDeletionVectors = false",
           partitioned: bool = False) -> int:
    """100 rows in ``files`` files by ``id`` (of 4: ids 0-24, 25-49, ...; one commit each), day and
    price rising with it. Returns the table's version."""
    spark.sql(f"CREATE TABLE delta.`{path}` ({SCHEMA}) USING delta "
              f"{'PARTITIONED BY (name) ' if partitioned else ''}TBLPROPERTIES ({properties})")
    size = 100 // files
    for k in range(files):
        rows = [(i, datetime.date(2024, 1, 1) + datetime.timedelta(days=i), Decimal(i) / 4, f"n{i % 3}")
                for i in range(k * size, (k + 1) * size)]
        spark.createDataFrame(rows, SCHEMA).coalesce(1).write.format("delta").mode("append").save(path)
    return files


def test_the_files_whose_statistics_can_hold_a_key_are_read_with_the_rows_delta_reads(spark, tmp_path):
    path = str(tmp_path / "t")
    version = _table(spark, path) + 1
    # a 5th file: id 300 and a null id (its null count 1), days and prices past the others'
    spark.createDataFrame([(300, datetime.date(2030, 1, 1), Decimal("75.00"), "n0"),
                           (None, datetime.date(2030, 1, 2), Decimal("75.25"), "n1")], SCHEMA) \
        .coalesce(1).write.format("delta").mode("append").save(path)
    actions = add_actions(path, version)
    assert actions is not None and actions.num_rows == 5
    delta = spark.read.format("delta").option("versionAsOf", version).load(path)
    cases = [
        ([("id", [(3, 3), (60, 70)], False)], 2),                                  # the 1st and 3rd files
        ([("id", [(400, 500)], False)], 0),                                        # none
        ([("id", [(3, 3)], True)], 2),                                             # the 1st, the 5th's null
        ([("id", [], True)], 1),                                                   # nulls alone: the 5th
        ([("id", [(0, 99)], False), ("day", [(datetime.date(2024, 1, 1),) * 2], False)], 1),  # both: the 1st
        ([("price", [(Decimal("20.00"), Decimal("20.25"))], False)], 1),           # ids 80, 81: the 4th
        ([("name", [("n1", "n1")], False)], 5),                                    # every file has n0-n2
        ([("name", [("n5", "n9")], False)], 0),                                    # strings past them all
        ([], 5),                                                                   # no ranges: every file
    ]
    for cuts, files in cases:
        uris = files_in_ranges(path, actions, delta.schema, cuts)
        assert len(uris) == files, (cuts, uris)
        listed, through_delta = read_files(spark, uris, delta.schema), delta
        for column, ranges, nulls in cuts:
            listed, through_delta = pruned(listed, column, ranges, nulls), pruned(through_delta, column, ranges, nulls)
        assert sorted(listed.collect(), key=str) == sorted(through_delta.collect(), key=str), cuts


def test_a_string_statistic_prunes_only_where_it_is_plainly_a_value(spark, tmp_path):
    """Three files by a string key: short keys; keys longer than the prefix Delta keeps of a
    statistic (its maximum cut, a character after the prefix); keys with a character beyond the
    basic plane. The short keys' file is pruned by both bounds, the long keys' by its minimum
    alone, the third never; the rows read are the rows Delta reads."""
    path, schema, long = str(tmp_path / "t"), "k STRING, v INT", "m" * 40
    for rows in ([("b1", 1), ("b2", 2)], [(long + "a", 3), (long + "z", 4)], [("q\U0001F600", 5), ("q\U0001F601", 6)]):
        spark.createDataFrame(rows, schema).coalesce(1).write.format("delta").mode("append").save(path)
    actions = add_actions(path, 2)
    assert actions is not None and actions.num_rows == 3
    delta = spark.read.format("delta").option("versionAsOf", 2).load(path)
    for ranges, files in [([("b1", "b1")], 2),             # the short keys' and the third
                          ([("zz", "zz")], 2),             # above b2: the long keys' (cut maximum), the third
                          ([("a", "a")], 1),               # below both minimums: the third
                          ([(long + "q", long + "q")], 2),  # in the long keys' file's bounds: it and the third
                          ([("b2", long + "b")], 3)]:
        uris = files_in_ranges(path, actions, delta.schema, [("k", ranges, False)])
        assert len(uris) == files, (ranges, uris)
        listed = pruned(read_files(spark, uris, delta.schema), "k", ranges)
        assert sorted(listed.collect()) == sorted(pruned(delta, "k", ranges).collect()), ranges


def test_a_file_without_statistics_is_kept(spark, tmp_path):
    path = str(tmp_path / "t")
    spark.conf.set("spark.databricks.delta.stats.collect", "false")
    try:
        version = _table(spark, path, files=2)
    finally:
        spark.conf.unset("spark.databricks.delta.stats.collect")
    delta = spark.read.format("delta").load(path)
    assert len(files_in_ranges(path, add_actions(path, version), delta.schema, [("id", [(200, 300)], False)])) == 2


def test_a_table_that_is_not_plain_parquet_is_left_to_delta(spark, tmp_path):
    """Deletion vectors (a reader feature) and partition columns: not listed here."""
    vectors, partitioned = str(tmp_path / "dv"), str(tmp_path / "part")
    version = _table(spark, vectors, properties="delta.enableDeletionVectors = true")
    spark.sql(f"DELETE FROM delta.`{vectors}` WHERE id = 7")
    assert add_actions(vectors, version + 1) is None
    assert add_actions(partitioned, _table(spark, partitioned, partitioned=True)) is None
    assert add_actions(str(tmp_path / "missing"), 0) is None
    assert spark.read.format("delta").load(vectors).where(F.col("id") == 7).count() == 0


def test_a_char_column_is_left_to_delta(spark, tmp_path):
    """Spark pads a ``CHAR`` column's values by its schema's metadata: such a table is read through Delta."""
    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, code CHAR(3)) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    delta = spark.read.format("delta").load(path)
    assert add_actions(path, 1) is not None
    assert read_files(spark, files_in_ranges(path, add_actions(path, 1), delta.schema, []), delta.schema) is None
