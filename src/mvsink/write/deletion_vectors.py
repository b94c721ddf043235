"""Delta Lake deletion vectors: reading and writing them as the Delta protocol specifies.

A deletion vector (DV) marks rows of one data file as deleted without rewriting the file: a set of
row positions (0-based indexes of the rows in the Parquet file, in file order). The protocol
(PROTOCOL.md, "Deletion Vectors", "Deletion Vector Format") fixes three layers, all here:

* a DV's **data**: the magic number 1681511377 (int32, little-endian), then the set as a 64-bit
  RoaringBitmap in the "portable" format of the RoaringFormatSpec: the count of 32-bit buckets
  (int64 LE), then per bucket in ascending order its key, the positions' high 32 bits (int32 LE),
  and a standard portable 32-bit RoaringBitmap of their low 32 bits (:func:`encode`,
  :func:`decode`; pyroaring's ``BitMap64`` reads and writes exactly that format);
* a **DV file** ``deletion_vector_<uuid>.bin``: a version byte (1), then per DV the data's size
  (int32, big-endian), the data, and the data's CRC-32 (big-endian) (:func:`write_dv_file`);
* a **descriptor**, the ``deletionVector`` field of an ``add``/``remove`` action:
  ``storageType`` (``u``: a file in the table directory named by a Z85-encoded UUID, after an
  optional random prefix that is a sub-directory; ``i``: the data inline, Z85-encoded; ``p``: a
  file at an absolute, URL-encoded URI), ``pathOrInlineDv``, ``offset`` (of the DV's size field in
  the file; absent for ``i``), ``sizeInBytes`` (of the data) and ``cardinality`` (positions).

Positions above 2^32 are handled (one bucket per high 32 bits, as the format says); positions
must be below 2^63 (the protocol requires every bucket key's top bit to be 0) and are int64
everywhere here, as Spark's row index is.

mvsink writes only ``u`` descriptors (one DV per file, at offset 1, no prefix) and reads ``u``,
``i`` and ``p`` ones. ``r`` (a plain relative path, Spark's ``adaptiveMetadata`` feature, not in
the protocol) is refused. :func:`delete_rows` turns a file's ``add`` and positions to delete into
the ``remove``/``add`` pair a commit carries, which :func:`mvsink.append.log_entry.commit_entry`
writes.

The table must allow DVs (reader version 3 / writer version 7 with ``deletionVectors`` among
both features, ``delta.enableDeletionVectors=true``); that is not checked here.
"""

from __future__ import annotations

import json
import struct
import urllib.parse
import uuid
import zlib
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64

from mvsink import storage

#: The magic number of the portable RoaringBitmapArray format, the one the protocol specifies
#: (Spark also reads 1681511376, an older "native" layout it no longer writes).
MAGIC = 1681511377
#: The version byte a DV file starts with.
FILE_FORMAT_VERSION = 1
#: The offset of the first (here: only) DV in a file we write: right after the version byte.
FIRST_OFFSET = 1
#: A Z85-encoded UUID is 20 characters; a ``u`` descriptor's characters before them are its prefix.
ENCODED_UUID_LENGTH = 20

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}


class DeletionVectorError(ValueError):
    """A DV that cannot be read as its descriptor says (corrupt, truncated, mismatched), or a
    deletion that cannot be written."""


# -- Z85 (ZeroMQ RFC 32), the protocol's Base85 variant ------------------------------------------

def z85_encode(data: bytes) -> str:
    """Z85 of ``data``, padded with zero bytes to a multiple of 4 first, as Delta pads inline DVs
    (a reader cuts the decoded bytes back to the descriptor's ``sizeInBytes``)."""
    padded = data + bytes(-len(data) % 4)
    chars = []
    for (word,) in struct.iter_unpack(">I", padded):
        block = []
        for _ in range(5):
            word, digit = divmod(word, 85)
            block.append(_Z85[digit])
        chars.extend(reversed(block))
    return "".join(chars)


def z85_decode(text: str) -> bytes:
    """The bytes of Z85 ``text`` (a multiple of 5 characters, 4 bytes per 5 characters)."""
    if len(text) % 5:
        raise DeletionVectorError(f"Z85 text of {len(text)} characters (not a multiple of 5): {text!r}")
    out = bytearray()
    for start in range(0, len(text), 5):
        word = 0
        for char in text[start:start + 5]:
            if char not in _Z85_VALUE:
                raise DeletionVectorError(f"not a Z85 character: {char!r} in {text!r}")
            word = word * 85 + _Z85_VALUE[char]
        if word > 0xFFFFFFFF:
            raise DeletionVectorError(f"Z85 block {text[start:start + 5]!r} is above 2^32 in {text!r}")
        out += word.to_bytes(4, "big")
    return bytes(out)


# -- a DV's data ------------------------------------------------------------------------------------

def _bitmap(positions: Iterable[int]) -> BitMap64:
    """``positions`` as a bitmap (repeats and order do not matter); any outside [0, 2^63) refused."""
    array = np.asarray(positions if isinstance(positions, np.ndarray) else list(positions))
    if array.size == 0:
        return BitMap64()
    if not np.issubdtype(array.dtype, np.integer):
        raise DeletionVectorError(f"row positions must be integers below 2^63, not {array.dtype}")
    if int(array.min()) < 0 or int(array.max()) >= 1 << 63:
        raise DeletionVectorError(f"row positions must be >= 0 and < 2^63; got {int(array.min())} "
                                  f"to {int(array.max())}")
    return BitMap64(array.astype(np.uint64))


def _positions(bitmap: BitMap64) -> np.ndarray:
    """The bitmap's positions, ascending, as int64."""
    return np.frombuffer(bitmap.to_array(), dtype=np.uint64).astype(np.int64)


def _serialize(bitmap: BitMap64) -> bytes:
    bitmap.run_optimize()  # runs of positions as run containers where smaller (as Spark's writer)
    return struct.pack("<i", MAGIC) + bitmap.serialize()


def encode(positions: Iterable[int]) -> bytes:
    """One DV's data for ``positions``: the magic number, then the portable 64-bit RoaringBitmap."""
    return _serialize(_bitmap(positions))


def _decode_bitmap(data: bytes, where: str = "deletion vector data") -> BitMap64:
    if len(data) < 12:
        raise DeletionVectorError(f"{where}: {len(data)} bytes is too short for a deletion vector")
    (magic,) = struct.unpack_from("<i", data)
    if magic != MAGIC:
        raise DeletionVectorError(f"{where}: magic number {magic}, not {MAGIC} (the portable "
                                  "RoaringBitmapArray format the Delta protocol specifies)")
    try:
        bitmap = BitMap64.deserialize(data[4:])
    except ValueError as exc:
        raise DeletionVectorError(f"{where}: not a portable 64-bit RoaringBitmap: {exc}") from exc
    if bitmap and bitmap.max() >= 1 << 63:
        raise DeletionVectorError(f"{where}: a bucket key with its top bit set (position {bitmap.max()})")
    return bitmap


def decode(data: bytes) -> np.ndarray:
    """The row positions (int64, ascending) of one DV's data, as :func:`encode` writes it."""
    return _positions(_decode_bitmap(data))


# -- descriptors and DV files -------------------------------------------------------------------------

def file_uri(table_uri: str, descriptor: dict[str, Any]) -> str:
    """Where an on-disk DV's file is: ``<table>/<prefix>/deletion_vector_<uuid>.bin`` for ``u``,
    the URL-decoded absolute URI for ``p`` (``file:`` URIs as local paths)."""
    kind, value = descriptor["storageType"], descriptor["pathOrInlineDv"]
    if kind == "u":
        if len(value) < ENCODED_UUID_LENGTH:
            raise DeletionVectorError(f"'u' deletion vector {value!r}: shorter than an encoded UUID")
        prefix, encoded = value[:-ENCODED_UUID_LENGTH], value[-ENCODED_UUID_LENGTH:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        return storage.join(table_uri, f"{prefix}/{name}" if prefix else name)
    if kind == "p":
        parts = urllib.parse.urlsplit(value)
        if parts.scheme == "file":
            return urllib.parse.unquote(parts.path)
        if parts.scheme in ("s3", "s3a"):
            return f"{parts.scheme}://{parts.netloc}{urllib.parse.unquote(parts.path)}"
        raise DeletionVectorError(f"'p' deletion vector {value!r}: only file:, s3: and s3a: URIs are read")
    raise DeletionVectorError(f"deletion vector of storage type {kind!r} has no file (u and p do)")


def _data(table_uri: str, descriptor: dict[str, Any]) -> tuple[bytes, str]:
    """A DV's data and a name for it in errors; the size field and CRC checked for a file."""
    kind, size = descriptor["storageType"], descriptor["sizeInBytes"]
    if kind == "i":
        data = z85_decode(descriptor["pathOrInlineDv"])
        if len(data) < size:
            raise DeletionVectorError(f"inline deletion vector of {len(data)} bytes, its sizeInBytes {size}")
        return data[:size], "inline deletion vector"
    if kind not in ("u", "p"):
        raise DeletionVectorError(f"deletion vector storage type {kind!r} is not read (u, i, p are)")
    uri = file_uri(table_uri, descriptor)
    offset = descriptor.get("offset") or 0
    where = f"deletion vector file {uri} at offset {offset}"
    fs, path = storage.filesystem(uri)

    def read() -> bytes:
        with fs.open_input_file(path) as f:
            return f.read_at(4 + size + 4, offset)

    stored = storage.retrying(f"reading {where}", read)
    if len(stored) != 4 + size + 4:
        raise DeletionVectorError(f"{where}: truncated ({len(stored)} of {4 + size + 4} bytes)")
    (size_in_file,) = struct.unpack_from(">i", stored)
    if size_in_file != size:
        raise DeletionVectorError(f"{where}: the file says {size_in_file} bytes, the descriptor {size}")
    data = stored[4:4 + size]
    (crc,) = struct.unpack_from(">I", stored, 4 + size)
    if crc != zlib.crc32(data):
        raise DeletionVectorError(f"{where}: CRC-32 mismatch (stored {crc:#010x}, "
                                  f"computed {zlib.crc32(data):#010x})")
    return data, where


def _read_bitmap(table_uri: str, descriptor: dict[str, Any]) -> BitMap64:
    data, where = _data(table_uri, descriptor)
    bitmap = _decode_bitmap(data, where)
    if len(bitmap) != descriptor["cardinality"]:
        raise DeletionVectorError(f"{where}: {len(bitmap)} positions, the descriptor's cardinality "
                                  f"{descriptor['cardinality']}")
    return bitmap


def read_dv(table_uri: str, descriptor: dict[str, Any]) -> np.ndarray:
    """The deleted row positions (int64, ascending) of the DV ``descriptor`` of a file of the table
    at ``table_uri``. Checks, as Spark's reader does, that the file's size field at ``offset``
    equals ``sizeInBytes`` and the CRC-32 matches (the version byte is not read), and also that
    the positions number ``cardinality``; raises :class:`DeletionVectorError` naming the file."""
    return _positions(_read_bitmap(table_uri, descriptor))


def _write_bitmap(table_uri: str, bitmap: BitMap64) -> dict[str, Any]:
    if not bitmap:
        raise DeletionVectorError("a deletion vector of no positions: nothing to write")
    data = _serialize(bitmap)
    blob = (bytes([FILE_FORMAT_VERSION]) + struct.pack(">i", len(data)) + data
            + struct.pack(">I", zlib.crc32(data)))
    file_id = uuid.uuid4()
    descriptor = {"storageType": "u", "pathOrInlineDv": z85_encode(file_id.bytes),
                  "offset": FIRST_OFFSET, "sizeInBytes": len(data), "cardinality": len(bitmap)}
    fs, path = storage.filesystem(file_uri(table_uri, descriptor))

    def write() -> None:
        with fs.open_output_stream(path) as out:
            out.write(blob)

    storage.retrying(f"writing deletion vector file {path}", write)
    return descriptor


def write_dv_file(table_uri: str, positions: Iterable[int]) -> dict[str, Any]:
    """Write a new DV file holding one DV of ``positions`` (not empty) into the table directory,
    and return its descriptor as it goes in an action's ``deletionVector`` field (``u``, offset 1,
    no prefix). The file name's UUID is new, so nothing is overwritten; the file is unreferenced
    (VACUUM deletes it) until a commit's ``add`` names it."""
    return _write_bitmap(table_uri, _bitmap(positions))


#: The fields of an add that its remove repeats (path, DV and size among them).
_REMOVE_FIELDS = ("partitionValues", "size", "stats", "tags", "deletionVector",
                  "baseRowId", "defaultRowCommitVersion")


def delete_rows(table_uri: str, add: dict[str, Any], positions: Iterable[int],
                timestamp_ms: int) -> list[dict[str, Any]]:
    """The actions that delete the rows at ``positions`` of the logical file ``add`` (an add
    action of the table's current snapshot, as in the log JSON, without its ``{"add": ...}``
    wrapper): ``[]`` if they are all deleted already; ``[remove]`` if no row of the file is left
    (no DV then, as Spark removes such a file); else ``[remove, add]``, the same file with a new DV
    holding the positions its current DV held and ``positions`` (written here).

    The ``remove`` names ``add``'s current DV (a logical file is its path and its DV), both are
    ``dataChange: true``; the new ``add`` keeps ``add``'s fields and statistics but marks its
    bounds wide (``tightBounds: false``): ``numRecords`` still counts the file's physical rows, as
    the protocol requires of a file with a DV, so ``add`` must carry it. Positions must be below
    ``numRecords``. The caller commits the actions in one version
    (:func:`mvsink.append.log_entry.commit_entry`)."""
    stats = json.loads(add.get("stats") or "{}")
    if "numRecords" not in stats:
        raise DeletionVectorError(f"{add['path']}: no numRecords statistic, which a file with a "
                                  "deletion vector must have")
    rows = stats["numRecords"]
    current = add.get("deletionVector")
    deleted = _read_bitmap(table_uri, current) if current else BitMap64()
    wanted = deleted | _bitmap(positions)
    if wanted and wanted.max() >= rows:
        raise DeletionVectorError(f"{add['path']}: position {wanted.max()} is past its {rows} rows")
    if len(wanted) == len(deleted):
        return []
    remove = {"path": add["path"], "deletionTimestamp": timestamp_ms, "dataChange": True,
              "extendedFileMetadata": True,
              **{k: add[k] for k in _REMOVE_FIELDS if add.get(k) is not None}}
    if len(wanted) == rows:
        return [{"remove": remove}]
    new_add = {**add, "dataChange": True, "deletionVector": _write_bitmap(table_uri, wanted),
               "stats": json.dumps({**stats, "tightBounds": False}, separators=(",", ":"))}
    return [{"remove": remove}, {"add": new_add}]


# -- logical files ---------------------------------------------------------------------------------------

#: Between a data file's path and its DV's identity in the name of a logical file that has a DV.
_DV_MARK = "#dv:"


def logical_file(path: str, descriptor: dict[str, Any] | None) -> str:
    """The name of the logical file ``path`` with the DV ``descriptor`` (None: none): its path
    alone where it has no DV, else its path and its DV's place. A file whose DV changes is another
    logical file (the protocol's identity of a file is its path and its DV)."""
    if not descriptor:
        return path
    return (f"{path}{_DV_MARK}{descriptor['storageType']}{descriptor['pathOrInlineDv']}"
            f"@{descriptor.get('offset', '')}")


def path_of(logical: str) -> str:
    """The data file's path of the logical file named ``logical`` (:func:`logical_file`)."""
    return logical.split(_DV_MARK, 1)[0]


# -- reading a table's rows without the deleted ones ----------------------------------------------------

#: The columns :func:`live_rows` gives a row's file and position in.
FILE, ROW = "_mv_file", "_mv_row"


def _normalized(uri: str) -> str:
    """A data file's URI as Spark's ``_metadata.file_path`` and an add action's path both give it:
    URL-decoded, ``file:`` dropped (local paths absolute), ``s3a:`` as ``s3:``."""
    uri = urllib.parse.unquote(uri)
    if uri.startswith("file:"):
        return "/" + uri[len("file:"):].lstrip("/")
    return "s3:" + uri[len("s3a:"):] if uri.startswith("s3a:") else uri


def live_rows(spark, table_uri: str, files: dict[str, dict[str, Any] | None], schema, positions: bool = False):
    """The rows of the logical files ``files`` (path as in an add action -> its DV descriptor,
    or None) of the table at ``table_uri``, in Spark, with ``schema``: every row of a file without
    a DV, and a file's rows at the positions its DV deletes left out. The DVs are read here (on
    the driver) and sent to the tasks as bitmaps (a broadcast); each task drops the rows whose
    (file, row index) a bitmap holds (Spark's ``_metadata.row_index``, the position in the file).
    ``positions``: each row also has its file (:data:`FILE`, as Spark names it) and its position
    in the file (:data:`ROW`)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    from mvsink.table import file_uri

    uris = [file_uri(table_uri, path) for path in sorted(files)]
    rows = spark.read.schema(schema).parquet(*uris).select(
        "*", F.col("_metadata.file_path").alias(FILE), F.col("_metadata.row_index").alias(ROW))
    deleted = {_normalized(file_uri(table_uri, path)): _read_bitmap(table_uri, descriptor).serialize()
               for path, descriptor in files.items() if descriptor}
    out = T.StructType(schema.fields + [T.StructField(FILE, T.StringType()), T.StructField(ROW, T.LongType())]
                       ) if positions else schema
    if not deleted:
        return rows.select(*out.names)
    shared = spark.sparkContext.broadcast(deleted)
    arrow_schema = to_arrow_schema(out)
    names = out.names

    def keep(batches):
        import pyarrow.compute as pc

        bitmaps: dict[str, np.ndarray | None] = {}  # by file, as Spark names it
        for batch in batches:
            paths, at = batch.column(FILE), batch.column(ROW).to_numpy(zero_copy_only=False)
            distinct = pc.unique(paths).to_pylist()
            gone = np.zeros(batch.num_rows, dtype=bool)
            for path in distinct:
                if path not in bitmaps:
                    blob = shared.value.get(_normalized(path))
                    bitmaps[path] = None if blob is None else _positions(BitMap64.deserialize(blob))
                if bitmaps[path] is None:
                    continue
                hit = np.isin(at, bitmaps[path])
                if len(distinct) > 1:
                    hit &= pc.equal(paths, path).to_numpy(zero_copy_only=False)
                gone |= hit
            if gone.any():
                batch = batch.filter(pa.array(~gone))
            yield pa.RecordBatch.from_arrays([batch.column(n) for n in names], schema=arrow_schema)

    return rows.mapInArrow(keep, out)
