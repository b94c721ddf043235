"""Peeks: a view's rows at a time, filtered, projected, paged, size-bounded, with clear refusals."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from mvsink import ChangesInput, ViewDefinition, read_view
from mvsink.append import Shard, compare_and_append
from mvsink.mint import Description
from mvsink.replica import peek as peek_module
from mvsink.replica.peek import PeekError, PeekNotReady, PeekRequest, _encoder, run_peek
from mvsink.target.create import create_target
from mvsink.updates import table_schema
from mvsink.write import stage

VIEW = "peeks"
USER = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType()),
                     T.StructField("price", T.DecimalType(10, 2)), T.StructField("day", T.DateType()),
                     T.StructField("tags", T.ArrayType(T.StringType()))])
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("price", pa.decimal128(10, 2)),
                          ("day", pa.date32()), ("tags", pa.list_(pa.string()))])


def update(id_, v, time, diff=1, error=None) -> tuple:
    user = (None,) * 5 if error else (id_, v, Decimal(id_) / 4, datetime.date(2024, 1, id_), [v] * id_)
    return (*user, error, time, diff)


#: Readable at [1, 5): 1 {1, 2, 3}; 2 adds a second 2 and two 4s; 3 drops 1; 4 is in error.
BATCHES = {
    Description(1, 3): [update(1, "a", 1), update(2, "b", 1), update(3, "c", 1),
                        update(2, "b", 2), update(4, "d", 2, diff=2)],
    Description(3, 5): [update(1, "a", 3, diff=-1), update(0, None, 4, error="ValueError: row 5 is bad")],
}


@pytest.fixture(scope="module")
def target(spark, tmp_path_factory):
    """The view of :data:`BATCHES`, written with mvsink's own stage and append."""
    tgt = str(tmp_path_factory.mktemp("peek") / "tgt")
    view = ViewDefinition(VIEW, tgt, ChangesInput(tgt), as_of=1, replica_id="r1", layout="updates")
    create_target(view, table_schema(USER))
    shard = Shard(tgt, view.app_id, VIEW, "r1")
    for desc, rows in BATCHES.items():
        batch = stage(spark.createDataFrame(rows, table_schema(USER)), desc, tgt, VIEW, "r1")
        assert compare_and_append(shard, desc, batch, "correction").appended
    return tgt


@pytest.fixture(scope="module")
def big(spark, tmp_path_factory):
    """A view of 20000 rows at time 0: ids 0..19999 out of order; row x is (7919 x mod 20000, f"v{x:05d}")."""
    tgt = str(tmp_path_factory.mktemp("peek") / "big")
    view = ViewDefinition("big", tgt, ChangesInput(tgt), replica_id="r1", layout="updates")
    schema = table_schema(T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())]))
    create_target(view, schema)
    rows = spark.range(20000).selectExpr("(id * 7919) % 20000 AS id", "format_string('v%05d', id) AS v",
                                         "CAST(NULL AS STRING) AS _mv_error", "0L AS _mv_time", "1L AS _mv_diff")
    desc = Description(0, 1)
    batch = stage(rows.repartition(3), desc, tgt, "big", "r1")
    assert compare_and_append(Shard(tgt, view.app_id, "big", "r1"), desc, batch, "correction").appended
    return tgt


def peek(spark, target, time=2, **fields) -> pa.Table:
    return run_peek(spark, PeekRequest(VIEW, target, time, **fields))


def _rows(table: pa.Table) -> list[tuple]:
    return [tuple(r.values()) for r in table.to_pylist()]


def test_rows_at_each_time_are_the_view_sorted_with_arrow_types(spark, target):
    for t in (1, 2, 3):
        table = peek(spark, target, t)
        assert table.schema == ARROW_SCHEMA
        assert _rows(table) == sorted(tuple(r) for r in read_view(spark, target, VIEW, t).collect()), t
        assert [r[0] for r in _rows(table)] == {1: [1, 2, 3], 2: [1, 2, 2, 3, 4, 4], 3: [2, 2, 3, 4, 4]}[t]


def test_filter_and_projection(spark, target):
    table = peek(spark, target, 2, filter="id >= 2 AND v <> 'd'", columns=("v", "id"))
    assert table.column_names == ["v", "id"]
    assert _rows(table) == [("b", 2), ("b", 2), ("c", 3)]
    table = peek(spark, target, 3, filter="size(tags) > 2", columns=["day"])
    assert _rows(table) == [(datetime.date(2024, 1, 3),)] + [(datetime.date(2024, 1, 4),)] * 2
    empty = peek(spark, target, 3, filter="id > 100")
    assert empty.num_rows == 0 and empty.schema == ARROW_SCHEMA


def test_offset_and_limit_page_through_copies_in_a_stable_order(spark, target):
    def page(offset, limit):
        return [r[0] for r in _rows(peek(spark, target, 2, columns=("id",), offset=offset, limit=limit))]

    assert page(0, 2) + page(2, 2) + page(4, 2) == [1, 2, 2, 3, 4, 4]
    assert page(1, 2) == [2, 2], "both copies of row 2"
    assert page(3, None) == [3, 4, 4]


def test_a_result_past_max_result_bytes_fails_and_a_limited_one_does_not(spark, target):
    full = peek(spark, target, 2)
    assert peek(spark, target, 2, max_result_bytes=full.nbytes).equals(full)
    with pytest.raises(PeekError, match=f"exceeds max_result_bytes {full.nbytes - 1} "):
        peek(spark, target, 2, max_result_bytes=full.nbytes - 1)
    limited = peek(spark, target, 2, limit=1, max_result_bytes=full.nbytes - 1)
    assert _rows(limited) == _rows(full)[:1]


@pytest.fixture
def uncoalesced(spark):
    """Results in all of the session's 4 shuffle partitions (AQE would make small ones one)."""
    key = "spark.sql.adaptive.coalescePartitions.enabled"
    spark.conf.set(key, "false")
    yield
    spark.conf.unset(key)


def test_a_large_view_comes_in_many_chunks_in_order_and_only_within_the_maximum(spark, big, monkeypatch,
                                                                                 uncoalesced):
    monkeypatch.setattr(peek_module, "_CHUNK_BYTES", 10_000)  # many chunks, several per task
    table = run_peek(spark, PeekRequest("big", big, 0, columns=("id",)))
    assert table["id"].to_pylist() == list(range(20000))
    # 160 kB of ids in 4 partitions: each task stays below the maximum, their sum does not.
    with pytest.raises(PeekError, match="exceeds max_result_bytes 100000 "):
        run_peek(spark, PeekRequest("big", big, 0, columns=("id",), max_result_bytes=100_000))
    page = run_peek(spark, PeekRequest("big", big, 0, offset=12345, limit=3, max_result_bytes=100))
    assert page.to_pylist() == [{"id": i, "v": f"v{i * 17679 % 20000:05d}"} for i in (12345, 12346, 12347)]


def test_a_task_stops_reading_its_rows_once_past_max_result_bytes():
    consumed = []

    def batches():
        for i in range(100):
            consumed.append(i)
            yield pa.RecordBatch.from_pydict({"x": list(range(i * 100, i * 100 + 100))})  # 800 bytes

    chunks = list(_encoder(max_bytes=2000, chunk_bytes=300)(batches()))
    assert consumed == [0, 1, 2], "the third batch passes the maximum"
    assert [c["exceeded"][0].as_py() for c in chunks] == [False] * (len(chunks) - 1) + [True]
    decoded = pa.Table.from_batches([b for c in chunks[:-1] for b in pa.ipc.open_stream(c["ipc"][0].as_py())])
    assert decoded["x"].to_pylist()[:200] == list(range(200)) and decoded.nbytes <= 2000
    assert all(b.nbytes <= 300 for c in chunks[:-1] for b in pa.ipc.open_stream(c["ipc"][0].as_py()))


def test_times_outside_since_and_upper(spark, target):
    with pytest.raises(PeekError, match=r"view 'peeks' is readable at times \[1, 5\), not at time 0") as info:
        peek(spark, target, 0)
    assert not isinstance(info.value, PeekNotReady), "below the since, waiting does not help"
    for t in (5, 100):
        with pytest.raises(PeekNotReady, match=rf"readable at times \[1, 5\), not at time {t}"):
            peek(spark, target, t)


def test_a_view_in_error_answers_with_its_errors(spark, target):
    with pytest.raises(PeekError, match="view 'peeks' is in error at time 4: .*ValueError: row 5 is bad") as info:
        peek(spark, target, 4, filter="id < 3", limit=1)
    assert not isinstance(info.value, PeekNotReady)


@pytest.mark.parametrize("fields, message", [
    ({"columns": ("id", "nope")}, r"^unknown column 'nope' in the projection: view 'peeks' has columns id, v, "),
    ({"columns": ("_mv_time",)}, r"^column '_mv_time' in the projection is reserved for mvsink"),
    ({"filter": "id >"}, r"^filter 'id >' does not parse: "),
    ({"filter": "nope = 1"}, r"^filter 'nope = 1' names unknown column `nope`: view 'peeks' has columns id, "),
    ({"filter": "_mv_diff > 1"}, r"^filter '_mv_diff > 1' names column `_mv_diff`, which is reserved for mvsink"),
    ({"filter": "_MV_ERROR IS NULL"}, r"^filter '_MV_ERROR IS NULL' names column `_MV_ERROR`, which is reserved"),
    ({"filter": "id + 1"}, r"^filter 'id \+ 1' is not a boolean condition over the columns of view 'peeks': "),
    ({"filter": "max(id) > 1"}, r"^filter 'max\(id\) > 1' is not a boolean condition"),
])
def test_bad_projection_or_filter_is_refused_with_what_was_wrong(spark, target, fields, message):
    with pytest.raises(PeekError, match=message):
        peek(spark, target, 2, **fields)


@pytest.mark.parametrize("fields, message", [
    ({"offset": -1}, "offset must be an integer >= 0"),
    ({"limit": -1}, "limit must be None or an integer in"),
    ({"limit": 2.0}, "limit must be None or an integer in"),
    ({"max_result_bytes": 0}, "max_result_bytes must be a positive integer"),
    ({"time": "2"}, "time must be an integer in"),
    ({"time": True}, "time must be an integer in"),
    ({"time": -1}, "time must be an integer in"),
    ({"columns": "id"}, "columns must be None or a non-empty tuple"),
    ({"columns": ()}, "columns must be None or a non-empty tuple"),
    ({"columns": ("id", "id")}, "columns must be free of duplicates"),
    ({"filter": " "}, "filter must be None or a non-empty"),
    ({"view_id": ""}, "view_id must be a non-empty string"),
])
def test_bad_request_fields_are_refused(spark, tmp_path, fields, message):
    request = {"view_id": VIEW, "target": str(tmp_path / "missing"), "time": 2, **fields}
    with pytest.raises(PeekError, match="^bad peek request: " + message):
        run_peek(spark, PeekRequest(**request))
