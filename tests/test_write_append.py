"""write stages corrections as Parquet files with statistics; append commits them with CAS."""

from __future__ import annotations

import datetime
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark.sql import types as T

from mvsink.append import Shard, compare_and_append
from mvsink.mint import Description
from mvsink.target.create import create_target
from mvsink.updates import table_schema
from mvsink.view import ChangesInput, ViewDefinition
from mvsink.write import ROW_GROUP_ROWS, _FileWriter, batch_updates, stage

USER = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
SCHEMA = table_schema(USER)


def _view(tmp_path, as_of=0) -> ViewDefinition:
    return ViewDefinition("w", str(tmp_path / "t"), ChangesInput(str(tmp_path / "src")), key=("id",),
                          as_of=as_of, replica_id="r1", layout="updates")


def _corrections(spark, rows):
    return spark.createDataFrame(rows, SCHEMA).repartition(2)


def test_batch_keeps_times_below_upper_and_advances_them_to_lower(spark):
    corrections = _corrections(spark, [
        (1, "a", None, 3, 1), (2, "b", None, 5, 1), (2, "b", None, 4, -1), (3, "c", None, 9, 1), (4, "d", None, 6, 2),
    ])
    batch = batch_updates(corrections, Description(5, 9), corrections_since=3)
    got = sorted(tuple(r) for r in batch.collect())
    # (2, b) at 4 (-1) and at 5 (+1) cancel once both are at lower; time 9 is not below upper.
    assert got == [(1, "a", None, 5, 1), (4, "d", None, 6, 2)]


def test_stage_writes_one_file_per_nonempty_partition_with_exact_stats(spark, tmp_path):
    view = _view(tmp_path)
    create_target(view, SCHEMA)
    rows = [(i, f"v{i}", None, 7, 1) for i in range(100)] + [(None, None, "boom", 8, 1)]
    staged = stage(_corrections(spark, rows), Description(7, 9), view.target, "w", "r1")
    assert 1 <= len(staged.files) <= 2
    assert staged.num_records == 101
    seen = 0
    for f in staged.files:
        assert f.path.startswith("mvsink-w-7-9-r1-")
        assert os.path.getsize(os.path.join(view.target, f.path)) == f.size
        stats = json.loads(f.stats)
        data = spark.read.parquet(os.path.join(view.target, f.path)).collect()
        seen += len(data)
        assert stats["numRecords"] == len(data)
        ids = [r.id for r in data if r.id is not None]
        if ids:
            assert stats["minValues"]["id"] == min(ids) and stats["maxValues"]["id"] == max(ids)
        assert stats["nullCount"]["_mv_error"] == sum(r._mv_error is None for r in data)
        assert stats["minValues"]["_mv_time"] == min(r._mv_time for r in data)
    assert seen == 101


def test_empty_correction_stages_nothing(spark, tmp_path):
    view = _view(tmp_path)
    create_target(view, SCHEMA)
    before = set(os.listdir(view.target))
    staged = stage(spark.createDataFrame([], SCHEMA), Description(0, 4), view.target, "w", "r1")
    assert staged.files == [] and set(os.listdir(view.target)) == before


def _staged(spark, view, desc, rows):
    return stage(_corrections(spark, rows), desc, view.target, view.view_id, view.replica_id)


def test_first_append_advances_the_upper_to_as_of_then_appends(spark, tmp_path):
    view = _view(tmp_path, as_of=10)
    create_target(view, SCHEMA)
    shard = Shard(view.target, view.app_id, view.view_id, view.replica_id)
    batch = _staged(spark, view, Description(10, 12), [(1, "a", None, 10, 1)])
    result = compare_and_append(shard, batch.desc, batch, "correction")
    assert result.appended and result.upper == 12 and shard.upper() == 12
    history = [h for h in reversed(DeltaTable(view.target).history()) if h.get("mvsink.view") == "w"]
    assert [(h["mvsink.lower"], h["mvsink.upper"], h["mvsink.reason"]) for h in history] == [
        (0, 10, "advance-upper"), (10, 12, "correction")]
    assert history[1]["mvsink.replica"] == "r1"


def test_loser_deletes_its_staged_files_and_learns_the_winners_upper(spark, tmp_path):
    view = _view(tmp_path)
    create_target(view, SCHEMA)
    winner = Shard(view.target, view.app_id, "w", "winner")
    loser = Shard(view.target, view.app_id, "w", "loser")
    won = _staged(spark, view, Description(0, 3), [(1, "a", None, 0, 1)])
    lost = _staged(spark, view, Description(0, 3), [(1, "a", None, 0, 1), (2, "b", None, 1, 1)])
    assert compare_and_append(winner, won.desc, won, "correction").appended
    result = compare_and_append(loser, lost.desc, lost, "correction")
    assert not result.appended and result.upper == 3
    for f in lost.files:
        assert not os.path.exists(os.path.join(view.target, f.path))
    assert all(os.path.exists(os.path.join(view.target, f.path)) for f in won.files)
    assert DeltaTable(view.target).to_pyarrow_table().num_rows == 1


def test_stale_description_loses_even_after_the_upper_moved_on(spark, tmp_path):
    view = _view(tmp_path)
    create_target(view, SCHEMA)
    shard = Shard(view.target, view.app_id, "w", "r1")
    assert compare_and_append(shard, Description(0, 2), None, "progress").appended
    assert compare_and_append(shard, Description(2, 5), None, "progress").appended
    stale = _staged(spark, view, Description(2, 4), [(9, "z", None, 2, 1)])
    assert not compare_and_append(shard, stale.desc, stale, "correction").appended
    assert shard.upper() == 5


def test_progress_commit_carries_no_files(spark, tmp_path):
    view = _view(tmp_path)
    create_target(view, SCHEMA)
    shard = Shard(view.target, view.app_id, "w", "r1")
    compare_and_append(shard, Description(0, 1), None, "progress")
    assert DeltaTable(view.target).get_add_actions().num_rows == 0


def test_a_staged_file_dictionary_encodes_only_the_columns_its_rows_repeat(tmp_path):
    """A key or hash column (mostly distinct values) is written plain, as Spark's writer ends up
    writing it; a column of few values, a sparse one and a date stay dictionary-encoded; a nested
    column is not; every value reads back as written."""
    n = 30_000
    rows = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "note": pa.array([f"{i * 7919:x}" for i in range(n)]),
        "segment": pa.array(["abc"[i % 3] for i in range(n)]),
        "sparse": pa.array([None if i % 10 else i % 4 for i in range(n)], pa.int32()),
        "day": pa.array([datetime.date(2020, 1, 1 + i % 28) for i in range(n)]),
        "tags": pa.array([[i % 2] for i in range(n)], pa.list_(pa.int32())),
    })
    writer = _FileWriter(str(tmp_path), "staged.parquet")
    for batch in rows.to_batches(max_chunksize=10_000):
        writer.write(batch)
    assert writer.close()["num_records"].to_pylist() == [n]
    file = pq.ParquetFile(tmp_path / "staged.parquet")
    group = file.metadata.row_group(0)
    dictionary = {group.column(i).path_in_schema: group.column(i).has_dictionary_page
                  for i in range(group.num_columns)}
    assert dictionary == {"id": False, "note": False, "segment": True, "sparse": True, "day": True,
                          "tags.list.element": False}, dictionary
    assert file.read().equals(rows)


def test_a_staged_file_holds_row_groups_a_lookup_can_skip(tmp_path):
    rows = 2 * ROW_GROUP_ROWS + 5_000
    writer = _FileWriter(str(tmp_path), "f.parquet")
    for start in range(0, rows, 10_000):  # as Spark hands a task its rows
        writer.write(pa.record_batch({"id": pa.array(range(start, min(start + 10_000, rows)), pa.int64())}))
    writer.close()
    metadata = pq.ParquetFile(tmp_path / "f.parquet").metadata
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sizes == [ROW_GROUP_ROWS, ROW_GROUP_ROWS, 5_000]
    bounds = [metadata.row_group(i).column(0).statistics for i in range(metadata.num_row_groups)]
    assert [(b.min, b.max) for b in bounds] == [(0, ROW_GROUP_ROWS - 1), (ROW_GROUP_ROWS, 2 * ROW_GROUP_ROWS - 1),
                                                (2 * ROW_GROUP_ROWS, rows - 1)]
