"""Deletion vectors (:mod:`mvsink.write.deletion_vectors`) as the Delta protocol specifies them,
proven against real readers and writers: the codec on the protocol's own examples and on edge
cases (positions above 2^32, inline and absolute descriptors, corruption found); Spark's DVs read
exactly (the positions its DELETE deleted, a second DELETE's union); our DVs, committed by hand
into a table Spark made, read as the remaining rows by Spark, DuckDB's ``delta_scan`` and
delta-rs (a second commit's union too); delta-rs appends, Spark's VACUUM and OPTIMIZE on such a
table keep the deleted rows deleted; and on S3 (moto): our DV files written and read, and the
conditional PUT a log writer's put-if-absent needs refused on an existing key."""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
import urllib.parse
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap

from helpers import rows_by_readers
from mvsink import table as delta_log
from mvsink.append import log_entry
from mvsink.write import deletion_vectors as dv

# -- the codec alone ---------------------------------------------------------------------------------


def test_z85_is_zeromq_rfc_32_and_pads_as_delta_does():
    assert dv.z85_encode(bytes.fromhex("864FD26FB559F75B")) == "HelloWorld"  # RFC 32's test vector
    assert dv.z85_decode("HelloWorld") == bytes.fromhex("864FD26FB559F75B")
    for n in range(0, 13):
        data = os.urandom(n)
        text = dv.z85_encode(data)
        assert len(text) == 5 * -(-n // 4)
        assert dv.z85_decode(text)[:n] == data and set(dv.z85_decode(text)[n:]) <= {0}
    with pytest.raises(dv.DeletionVectorError, match="multiple of 5"):
        dv.z85_decode("Hello1")
    with pytest.raises(dv.DeletionVectorError, match="not a Z85 character"):
        dv.z85_decode("Hell\"")


def test_the_protocols_uuid_descriptor_names_its_file_under_its_prefix():
    # PROTOCOL.md, "JSON Example 1": a relative DV with the random prefix "ab".
    descriptor = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 4,
                  "sizeInBytes": 40, "cardinality": 6}
    assert (dv.file_uri("s3://mytable/", descriptor)
            == "s3://mytable/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin")
    no_prefix = {**descriptor, "pathOrInlineDv": descriptor["pathOrInlineDv"][2:]}
    assert dv.file_uri("/t", no_prefix) == "/t/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    absolute = {**descriptor, "storageType": "p",
                "pathOrInlineDv": "file:/a%20b/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"}
    assert dv.file_uri("/t", absolute) == "/a b/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    with pytest.raises(dv.DeletionVectorError, match="storage type 'r'"):
        dv.read_dv("/t", {**descriptor, "storageType": "r"})


def test_data_is_the_magic_number_and_the_portable_64_bit_roaring_format_built_by_hand():
    """The layout written out from the spec with 32-bit bitmaps only (pyroaring's ``BitMap``,
    CRoaring's portable 32-bit format): one bucket per high 32 bits, ascending, empty ones absent."""
    low, high = [29, 3, 4, 4, 7, 11, 18], [(1 << 32) + 5, (1 << 32) + 1, (7 << 32)]
    by_hand = (struct.pack("<i", 1681511377) + struct.pack("<q", 3)
               + struct.pack("<i", 0) + BitMap([3, 4, 7, 11, 18, 29]).serialize()
               + struct.pack("<i", 1) + BitMap([1, 5]).serialize()
               + struct.pack("<i", 7) + BitMap([0]).serialize())
    assert dv.encode(low + high) == by_hand
    assert dv.decode(by_hand).tolist() == sorted(set(low + high))
    assert dv.decode(dv.encode(np.array([], dtype=np.int64))).tolist() == []
    # Runs of positions are stored as run containers (the 32-bit format's cookie 12347 says so).
    runs = dv.encode([3, 10, 11, 12, 13, 14, 15])
    assert struct.unpack_from("<H", runs, 4 + 8 + 4) == (12347,)
    assert dv.decode(runs).tolist() == [3, 10, 11, 12, 13, 14, 15]
    assert len(dv.encode(range(100_000, 300_000))) < 100  # 200,000 positions: 4 run containers
    assert dv.decode(dv.encode([(1 << 63) - 1])).tolist() == [(1 << 63) - 1]
    with pytest.raises(dv.DeletionVectorError, match=">= 0 and < 2\\^63"):
        dv.encode([3, -1])
    with pytest.raises(dv.DeletionVectorError, match=">= 0 and < 2\\^63"):
        dv.encode(np.array([1 << 63], dtype=np.uint64))
    with pytest.raises(dv.DeletionVectorError, match="top bit"):  # the protocol's rule on keys
        dv.decode(struct.pack("<i", 1681511377) + struct.pack("<q", 1) + struct.pack("<I", 1 << 31)
                  + BitMap([1]).serialize())


def test_the_protocols_inline_example_is_not_in_the_format_it_specifies():
    """PROTOCOL.md's "JSON Example 3" (positions 3, 4, 7, 11, 18, 29) decodes to the legacy
    "native" layout (magic 1681511376) written big-endian: neither the portable format the text
    specifies nor anything Spark's reader (little-endian, either magic) accepts. We refuse it by
    its magic number, as Spark does."""
    data = dv.z85_decode("wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L")
    assert len(data) == 40
    assert struct.unpack(">iii", data[:12]) == (1681511376, 1, 28)  # magic, bitmaps, size: big-endian
    assert list(BitMap.deserialize(data[12:])) == [3, 4, 7, 11, 18, 29]
    with pytest.raises(dv.DeletionVectorError, match="magic number -791463580"):
        dv.read_dv("/t", {"storageType": "i", "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
                          "sizeInBytes": 40, "cardinality": 6})
    # Our own inline DV (42 bytes, padded to 44 for Z85) reads back.
    data = dv.encode([3, 4, 7, 11, 18])
    inline = {"storageType": "i", "pathOrInlineDv": dv.z85_encode(data), "sizeInBytes": len(data), "cardinality": 5}
    assert len(data) == 42
    assert dv.read_dv("/t", inline).tolist() == [3, 4, 7, 11, 18]


def test_a_written_file_has_the_specified_layout_and_reads_back_by_u_and_p(tmp_path):
    table = tmp_path / "a table"  # a space: the 'p' URI is URL-encoded
    table.mkdir()
    positions = np.array([9, 2, (1 << 32) + 3, 2], dtype=np.int64)
    descriptor = dv.write_dv_file(str(table), positions)
    assert descriptor["storageType"] == "u" and len(descriptor["pathOrInlineDv"]) == 20
    assert (descriptor["offset"], descriptor["cardinality"]) == (1, 3)
    (name,) = os.listdir(table)
    assert name.startswith("deletion_vector_") and name.endswith(".bin")
    blob = (table / name).read_bytes()
    data = blob[5:-4]
    assert blob[0] == 1 and struct.unpack(">i", blob[1:5]) == (len(data),) == (descriptor["sizeInBytes"],)
    assert struct.unpack(">I", blob[-4:]) == (zlib.crc32(data),)
    assert data == dv.encode(positions)
    assert dv.read_dv(str(table), descriptor).tolist() == [2, 9, (1 << 32) + 3]
    assert dv.read_dv("file://" + str(table), descriptor).tolist() == [2, 9, (1 << 32) + 3]
    absolute = {**descriptor, "storageType": "p",
                "pathOrInlineDv": "file:" + urllib.parse.quote(str(table / name))}
    assert dv.read_dv("/elsewhere", absolute).tolist() == [2, 9, (1 << 32) + 3]
    with pytest.raises(dv.DeletionVectorError, match="no positions"):
        dv.write_dv_file(str(table), [])


def test_corruption_and_mismatched_descriptors_are_refused_naming_the_file(tmp_path):
    descriptor = dv.write_dv_file(str(tmp_path), range(0, 1000, 7))
    path = Path(dv.file_uri(str(tmp_path), descriptor))
    with pytest.raises(dv.DeletionVectorError, match=f"{path.name} at offset 1: 143 positions, .* cardinality 144"):
        dv.read_dv(str(tmp_path), {**descriptor, "cardinality": 144})
    with pytest.raises(dv.DeletionVectorError, match=f"{path.name} at offset 1: the file says"):
        dv.read_dv(str(tmp_path), {**descriptor, "sizeInBytes": descriptor["sizeInBytes"] - 1})
    with pytest.raises(dv.DeletionVectorError, match="truncated"):
        dv.read_dv(str(tmp_path), {**descriptor, "offset": 2})
    blob = bytearray(path.read_bytes())
    blob[20] ^= 0x40
    path.write_bytes(bytes(blob))
    with pytest.raises(dv.DeletionVectorError, match=f"{path.name} at offset 1: CRC-32 mismatch"):
        dv.read_dv(str(tmp_path), descriptor)


def test_delete_rows_unions_with_the_files_dv_and_removes_a_file_left_empty(tmp_path):
    add = {"path": "part-0.parquet", "partitionValues": {}, "size": 100, "modificationTime": 7,
           "dataChange": False, "stats": json.dumps({"numRecords": 10, "minValues": {"id": 0},
                                                     "maxValues": {"id": 9}, "nullCount": {"id": 0}})}
    remove, new = dv.delete_rows(str(tmp_path), add, [3, 1], timestamp_ms=123)
    assert remove == {"remove": {"path": "part-0.parquet", "deletionTimestamp": 123, "dataChange": True,
                                 "extendedFileMetadata": True, "partitionValues": {}, "size": 100,
                                 "stats": add["stats"]}}
    new = new["add"]
    assert {k: v for k, v in new.items() if k not in ("deletionVector", "stats", "dataChange")} == \
        {k: v for k, v in add.items() if k not in ("stats", "dataChange")}
    assert new["dataChange"] is True
    assert json.loads(new["stats"]) == {**json.loads(add["stats"]), "tightBounds": False}
    assert dv.read_dv(str(tmp_path), new["deletionVector"]).tolist() == [1, 3]

    assert dv.delete_rows(str(tmp_path), new, [3], timestamp_ms=124) == []  # deleted already
    remove, newer = dv.delete_rows(str(tmp_path), new, [3, 5], timestamp_ms=125)
    assert remove["remove"]["deletionVector"] == new["deletionVector"]  # the logical file it replaces
    assert dv.read_dv(str(tmp_path), newer["add"]["deletionVector"]).tolist() == [1, 3, 5]
    assert dv.delete_rows(str(tmp_path), newer["add"], [0, 2, 4, 6, 7, 8, 9], timestamp_ms=126) == [
        {"remove": {**remove["remove"], "deletionTimestamp": 126, "stats": newer["add"]["stats"],
                    "deletionVector": newer["add"]["deletionVector"]}}]
    with pytest.raises(dv.DeletionVectorError, match="position 10 is past its 10 rows"):
        dv.delete_rows(str(tmp_path), add, [10], timestamp_ms=127)
    with pytest.raises(dv.DeletionVectorError, match="no numRecords"):
        dv.delete_rows(str(tmp_path), {**add, "stats": None}, [1], timestamp_ms=127)


# -- S3 (moto) ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_s3():
    """moto's S3 in this process (ThreadedMotoServer) on a free 127.0.0.1 port, a bucket made."""
    import socket

    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket="dvs")
    yield endpoint, client
    server.stop()


def test_on_s3_our_dv_files_are_written_and_read_and_an_existing_key_refuses_a_conditional_put(
        moto_s3, monkeypatch):
    from botocore.exceptions import ClientError

    endpoint, client = moto_s3
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                       "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    descriptor = dv.write_dv_file("s3://dvs/table", [4, 8, 15, 16, 23, 42])
    key = dv.file_uri("s3://dvs/table", descriptor)[len("s3://dvs/"):]
    blob = client.get_object(Bucket="dvs", Key=key)["Body"].read()
    assert blob[0] == 1 and len(blob) == 1 + 4 + descriptor["sizeInBytes"] + 4
    assert dv.read_dv("s3a://dvs/table", descriptor).tolist() == [4, 8, 15, 16, 23, 42]

    log_key = "table/_delta_log/00000000000000000001.json"
    client.put_object(Bucket="dvs", Key=log_key, Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket="dvs", Key=log_key, Body=b"second", IfNoneMatch="*")
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket="dvs", Key=log_key)["Body"].read() == b"first"


# -- real tables: Spark, DuckDB, delta-rs ---------------------------------------------------------------


@pytest.fixture(scope="module")
def dv_spark(spark):
    """The session's Spark with this file's settings (restored after): VACUUM with retention 0."""
    settings = {"spark.databricks.delta.retentionDurationCheck.enabled": "false",
                "spark.sql.shuffle.partitions": "2"}
    saved = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    yield spark
    for k, v in saved.items():
        spark.conf.unset(k) if v is None else spark.conf.set(k, v)


def _log(table: str) -> list[tuple[int, list[dict]]]:
    """The table's log entries (version, actions), oldest first: every JSON entry from version 0
    (a checkpoint is not needed to replay them; none expires within a test)."""
    entries = sorted((Path(table) / "_delta_log").glob("[0-9]*.json"))
    assert entries[0].name == f"{0:020d}.json"
    return [(int(p.name.split(".")[0]), [json.loads(line) for line in p.read_text().splitlines() if line])
            for p in entries]


def _live_adds(table: str, version: int | None = None) -> dict[str, dict]:
    """The add action of each logical file of the table's snapshot at ``version`` (the latest if
    None), by path (:func:`mvsink.table.live_files`)."""
    return delta_log.live_files(table, _log(table)[-1][0] if version is None else version)


def _commit(table: str, actions: list[dict]) -> int:
    """Commit ``actions`` as the table's next version (:func:`mvsink.append.log_entry.commit_entry`); its version."""
    version = _log(table)[-1][0] + 1
    assert log_entry.commit_entry(table, version, actions, {"operation": "DELETE"})
    return version


def _file_rows(table: str, path: str) -> list[tuple]:
    """The rows of one data file, in file order (their positions)."""
    return [tuple(r.values()) for r in pq.read_table(os.path.join(table, urllib.parse.unquote(path))).to_pylist()]


def _expected(table: str) -> Counter:
    """The table's rows from its files and their DVs as the log says, decoded by us."""
    rows: Counter = Counter()
    for path, add in _live_adds(table).items():
        deleted = set(dv.read_dv(table, add["deletionVector"]).tolist()) if add.get("deletionVector") else set()
        rows.update(r for i, r in enumerate(_file_rows(table, path)) if i not in deleted)
    return rows


def _assert_read_as(spark, table: str, expected: Counter) -> None:
    assert {reader: rows == expected for reader, rows in rows_by_readers(spark, table, ["id", "name"]).items()} == \
        {"Spark": True, "DuckDB": True, "delta-rs": True}
    # Spark answers count(*) from the stats: numRecords less the DVs' cardinality.
    assert spark.sql(f"SELECT count(*) FROM delta.`{table}`").first()[0] == sum(expected.values())


def _make_table(spark, table: str, enable_dvs_first: bool) -> None:
    """Three files of 20 rows (ids 0-59, names 'n<id>'), one append each."""
    spark.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, name STRING) USING delta"
              + (" TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')" if enable_dvs_first else ""))
    for start in (0, 20, 40):
        (spark.range(start, start + 20, numPartitions=1).selectExpr("id", "concat('n', id) AS name")
         .write.format("delta").mode("append").save(table))


def test_spark_deletes_read_back_as_exactly_the_deleted_rows_positions(dv_spark, tmp_path):
    spark, table = dv_spark, str(tmp_path / "t")
    _make_table(spark, table, enable_dvs_first=True)
    before = _live_adds(table)
    assert len(before) == 3 and not any(a.get("deletionVector") for a in before.values())

    for predicate, deleted in [("id % 3 = 0", lambda i: i % 3 == 0),
                               ("id % 5 = 0", lambda i: i % 3 == 0 or i % 5 == 0)]:
        spark.sql(f"DELETE FROM delta.`{table}` WHERE {predicate}")
        adds = _live_adds(table)
        assert adds.keys() == before.keys()
        for path, add in adds.items():
            descriptor = add["deletionVector"]
            assert descriptor["storageType"] == "u"
            ids = [r[0] for r in _file_rows(table, path)]
            assert dv.read_dv(table, descriptor).tolist() == [i for i, v in enumerate(ids) if deleted(v)]
            stats = json.loads(add["stats"])
            assert stats["numRecords"] == 20 and stats["tightBounds"] is False
        # Spark writes a task's DVs into one file, one after another: with 2 shuffle partitions, at
        # most 2 files for these 3 DVs, so one is read at an offset past the first.
        assert max(add["deletionVector"]["offset"] for add in adds.values()) > 1
        _assert_read_as(spark, table, Counter((i, f"n{i}") for i in range(60) if not deleted(i)))


@pytest.fixture(scope="module")
def table_with_our_dvs(dv_spark, tmp_path_factory):
    """A table Spark wrote without DVs (three files), upgraded by ``ALTER TABLE``, then two
    commits of ours: the first deletes positions of two files by DVs, the second adds positions to
    the first file's DV (a union) and deletes every row of the third (its file removed). Returns
    its path and the rows left; tests copy it."""
    spark, table = dv_spark, str(tmp_path_factory.mktemp("ours") / "t")
    _make_table(spark, table, enable_dvs_first=False)
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    (protocol,) = [a["protocol"] for _, actions in _log(table) for a in actions if "protocol" in a][-1:]
    assert (protocol["minReaderVersion"], protocol["minWriterVersion"]) == (3, 7)
    assert "deletionVectors" in protocol["readerFeatures"] and "deletionVectors" in protocol["writerFeatures"]

    files = sorted(_live_adds(table).values(), key=lambda a: _file_rows(table, a["path"])[0][0])
    ids = {a["path"]: [r[0] for r in _file_rows(table, a["path"])] for a in files}
    a, b, c = (f["path"] for f in files)
    now = int(time.time() * 1000)
    first = {a: [0, 5, 6, 19], b: [3, 10, 11, 12, 13, 14, 15]}  # b's: a run container
    _commit(table, [x for path, positions in first.items()
                    for x in dv.delete_rows(table, _live_adds(table)[path], positions, now)])
    gone = {ids[p][i] for p, positions in first.items() for i in positions}
    _assert_read_as(spark, table, Counter((i, f"n{i}") for i in range(60) if i not in gone))
    assert _expected(table) == Counter((i, f"n{i}") for i in range(60) if i not in gone)

    second = {a: [5, 7, 8], c: list(range(20))}
    actions = [x for path, positions in second.items()
               for x in dv.delete_rows(table, _live_adds(table)[path], positions, now + 1)]
    assert [next(iter(x)) for x in actions] == ["remove", "add", "remove"]  # c's file removed outright
    _commit(table, actions)
    assert dv.read_dv(table, _live_adds(table)[a]["deletionVector"]).tolist() == [0, 5, 6, 7, 8, 19]
    assert set(_live_adds(table)) == {a, b}
    gone |= {ids[p][i] for p, positions in second.items() for i in positions}
    left = Counter((i, f"n{i}") for i in range(60) if i not in gone)
    assert sum(left.values()) == 60 - 4 - 7 - 2 - 20
    _assert_read_as(spark, table, left)
    return table, left


def _copy(table: str, tmp_path: Path) -> str:
    copy = str(tmp_path / "copy")
    shutil.copytree(table, copy)
    return copy


def _dvs(table: str) -> dict[str, dict]:
    return {path: add["deletionVector"] for path, add in _live_adds(table).items() if add.get("deletionVector")}


def test_delta_rs_appends_deletes_and_updates_on_a_table_with_our_dvs(dv_spark, table_with_our_dvs, tmp_path):
    """delta-rs writes to a table with our DVs: an append (``write_deltalake``) and a commit of its
    transaction API (``create_write_transaction``) leave the DVs in place; its DELETE and UPDATE
    rewrite a file without the rows its DV deletes, and their ``remove`` names the DV (so the
    logical file is gone for Spark too)."""
    from deltalake import DeltaTable, write_deltalake
    from deltalake.transaction import AddAction

    table, left = table_with_our_dvs
    table = _copy(table, tmp_path)
    dvs = _dvs(table)
    assert len(dvs) == 2

    write_deltalake(table, pa.table({"id": pa.array([100, 101], pa.int64()), "name": ["n100", "n101"]}),
                    mode="append")
    assert _dvs(table) == dvs
    left = left + Counter({(100, "n100"): 1, (101, "n101"): 1})
    _assert_read_as(dv_spark, table, left)

    # A file written by hand, committed by delta-rs's transaction API.
    pq.write_table(pa.table({"id": pa.array([102], pa.int64()), "name": ["n102"]}), f"{table}/by-hand.parquet")
    stats = {"numRecords": 1, "minValues": {"id": 102, "name": "n102"}, "maxValues": {"id": 102, "name": "n102"},
             "nullCount": {"id": 0, "name": 0}}
    dt = DeltaTable(table)
    dt.create_write_transaction([AddAction("by-hand.parquet", os.path.getsize(f"{table}/by-hand.parquet"), {},
                                           int(time.time() * 1000), True, json.dumps(stats))],
                                mode="append", schema=dt.schema())
    assert _dvs(table) == dvs
    left = left + Counter({(102, "n102"): 1})
    _assert_read_as(dv_spark, table, left)

    # One row of each file with a DV deleted, one updated, by delta-rs.
    doomed = {path: [r[0] for i, r in enumerate(_file_rows(table, path))
                     if i not in set(dv.read_dv(table, d).tolist())] for path, d in dvs.items()}
    (first, second) = sorted(doomed.values())
    DeltaTable(table).delete(f"id = {first[1]}")
    DeltaTable(table).update({"name": "'changed'"}, predicate=f"id = {second[1]}")
    removes = [a["remove"] for _, actions in _log(table)[-2:] for a in actions if "remove" in a]
    assert {r["path"]: r.get("deletionVector") for r in removes} == dvs
    assert _dvs(table) == {}
    left = left - Counter({(first[1], f"n{first[1]}"): 1, (second[1], f"n{second[1]}"): 1})
    _assert_read_as(dv_spark, table, left + Counter({(second[1], "changed"): 1}))


def test_delta_rs_add_actions_count_physical_rows_and_show_no_deletion_vector(table_with_our_dvs):
    """What delta-rs 1.6.6's ``get_add_actions`` tells of a table with DVs: its files'
    ``num_records`` are their physical rows (the DV's deleted ones included), and no column shows
    a DV, flattened or not: DVs are to be read from the log (the reason this module reads them)."""
    from deltalake import DeltaTable

    table, _ = table_with_our_dvs
    dt = DeltaTable(table)
    for flatten in (False, True):
        actions = pa.table(dt.get_add_actions(flatten=flatten))
        assert not [name for name in actions.column_names if "deletion" in name.lower()]
    assert {row["path"]: row["num_records"] for row in actions.to_pylist()} == \
        {path: json.loads(add["stats"])["numRecords"] for path, add in _live_adds(table).items()} == \
        {path: 20 for path in _live_adds(table)}


def test_spark_vacuum_keeps_our_dv_files_and_optimize_keeps_our_deletions(dv_spark, table_with_our_dvs, tmp_path):
    spark, (table, left) = dv_spark, table_with_our_dvs
    table = _copy(table, tmp_path)
    dv_files = {os.path.basename(dv.file_uri(table, d)) for d in _dvs(table).values()}
    on_disk = {p.name for p in Path(table).glob("deletion_vector_*.bin")}
    assert dv_files < on_disk  # the first commit's DV of the first file, replaced by the union, too

    spark.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS")
    assert {p.name for p in Path(table).glob("deletion_vector_*.bin")} == dv_files
    _assert_read_as(spark, table, left)

    spark.sql(f"OPTIMIZE delta.`{table}`")
    assert _dvs(table) == {}  # the files with DVs rewritten without their deleted rows
    _assert_read_as(spark, table, left)
    spark.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS")
    assert list(Path(table).glob("deletion_vector_*.bin")) == []
    _assert_read_as(spark, table, left)


def test_live_files_replays_from_spark_and_delta_rs_checkpoints_with_their_deletion_vectors(
        dv_spark, table_with_our_dvs, tmp_path):
    """:func:`mvsink.table.live_files` at every version (from the newest checkpoint at or below
    it, then the commits after) equals a replay of every commit from version 0, deletion vectors
    and all: through a multi-part checkpoint of Spark's and a checkpoint of delta-rs's."""
    from deltalake import DeltaTable

    spark = dv_spark
    table = _copy(table_with_our_dvs[0], tmp_path)
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    saved = spark.conf.get("spark.databricks.delta.checkpoint.partSize", None)
    spark.conf.set("spark.databricks.delta.checkpoint.partSize", "2")  # actions per part
    try:
        for n in (7, 11):
            spark.sql(f"DELETE FROM delta.`{table}` WHERE id % {n} = 0")
    finally:
        spark.conf.unset("spark.databricks.delta.checkpoint.partSize") if saved is None else \
            spark.conf.set("spark.databricks.delta.checkpoint.partSize", saved)
    path = next(iter(_live_adds(table)))
    _commit(table, dv.delete_rows(table, _live_adds(table)[path], [1, 2], int(time.time() * 1000)))
    DeltaTable(table).create_checkpoint()
    names = [p.name for p in (Path(table) / "_delta_log").iterdir()]
    parts = [n for n in names if n.endswith(".parquet") and ".checkpoint.0000000001." in n]
    assert parts and not parts[0].endswith(".0000000001.parquet"), f"no multi-part checkpoint: {sorted(names)}"
    latest = _log(table)[-1][0]
    assert f"{latest:020d}.checkpoint.parquet" in names
    commits_only = tmp_path / "commits-only"  # the same log without its checkpoints: replayed from version 0
    shutil.copytree(table, commits_only, ignore=shutil.ignore_patterns("*checkpoint*"))
    assert not list((commits_only / "_delta_log").glob("*checkpoint*"))

    def but_data_change(adds: dict[str, dict]) -> dict[str, dict]:  # a checkpoint's adds have it false
        return {path: {k: v for k, v in add.items() if k != "dataChange"} for path, add in adds.items()}

    for version in range(latest + 1):
        assert but_data_change(delta_log.live_files(table, version)) == \
            but_data_change(delta_log.live_files(str(commits_only), version)), f"at version {version}"
    assert delta_log.live_files(table, latest)[path]["deletionVector"] == \
        delta_log.live_files(str(commits_only), latest)[path]["deletionVector"]
    assert len(_dvs(table)) == 2


def test_live_rows_leave_out_what_spark_and_our_dvs_delete(dv_spark, table_with_our_dvs, tmp_path):
    """:func:`mvsink.write.deletion_vectors.live_rows` over a snapshot's logical files reads the
    rows every reader reads: our DVs (one file past its first DV's positions, one file none) and
    then Spark's (a DELETE over them, its DVs at offsets past the first in a shared file)."""
    from pyspark.sql import types as T

    spark = dv_spark
    table, left = table_with_our_dvs
    table = _copy(table, tmp_path)
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType())])

    def rows() -> Counter:
        files = {path: add.get("deletionVector") for path, add in delta_log.live_files(table, _log(table)[-1][0]).items()}
        return Counter(tuple(r) for r in dv.live_rows(spark, table, files, schema).collect())

    assert rows() == left
    spark.sql(f"DELETE FROM delta.`{table}` WHERE id % 4 = 1")
    now_left = Counter({row: n for row, n in left.items() if row[0] % 4 != 1})
    assert now_left != left
    _assert_read_as(spark, table, now_left)
    assert rows() == now_left
