"""`write`: stages a description's corrections as Parquet files in the table directory.

Given a description `[lower, upper)` and the correction buffer, the corrections with times below
`upper` (times below `lower` advanced to `lower`) are written by the Spark tasks that hold them:
one Parquet file per non-empty partition, straight into the target table's directory, each with
its Delta file statistics. Nothing is committed here; :mod:`mvsink.append` commits the files or
deletes them. The driver receives only the file list, never the rows.

On S3 each task writes its file to a local temporary file and then uploads it, retrying a failed
upload with bounded backoff (:func:`mvsink.storage.retrying`).

Staged file names start with ``mvsink-<view>-<lower>-<upper>-<replica>-<batch uuid>``, which is
how :mod:`mvsink.cleanup` recognises files left behind by a crash.

Invariants: an empty correction stages nothing; every staged file holds only times in
`[lower, upper)`, consolidated (no two updates with the same row and time, no zero diffs).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from mvsink import failpoints, storage
from mvsink.mint import Description
from mvsink.updates import DIFF, ERROR, TIME, consolidate
from mvsink.write.deletion_vectors import file_uri
from mvsink.write.stats import FileStats

if TYPE_CHECKING:
    from mvsink.desired.key_check import KeyRanges

log = logging.getLogger(__name__)

STAGED_PREFIX = "mvsink-"

#: Where a table-layout view's error updates are staged: a hidden folder of the table directory,
#: which Delta readers and VACUUM leave alone (see :mod:`mvsink.target.layout`).
ERRORS_DIR = "_mv_errors"

#: A staged file's Parquet row groups hold this many rows at most (DuckDB's own writer uses
#: 122,880): in a file sorted by the view's first key column, a reader looking up a key reads
#: the footer and one row group, skipping the others by their statistics.
ROW_GROUP_ROWS = 131_072
#: ... and this many bytes at most (in memory, Arrow), for wide rows.
ROW_GROUP_BYTES = 64 << 20

_FILE_LIST_SCHEMA = T.StructType(
    [
        T.StructField("path", T.StringType()),
        T.StructField("size", T.LongType()),
        T.StructField("num_records", T.LongType()),
        T.StructField("stats", T.StringType()),
        T.StructField("errors", T.BooleanType()),
        #: The updates the task was given, on its first file's row (0 on the others).
        T.StructField("updates", T.LongType()),
    ]
)


@dataclass(frozen=True)
class StagedFile:
    path: str  # relative to the table root
    size: int
    num_records: int
    stats: str


@dataclass
class StagedBatch:
    desc: Description
    target: str
    #: Data files to add.
    files: list[StagedFile] = field(default_factory=list)
    #: Each file's key report, where the staging was asked for one (see :func:`stage`).
    key_reports: list = field(default_factory=list)
    #: Table layout only: ``(path, size)`` of the table's files the batch rewrites (they go, their
    #: rewritten survivors are among ``files``), and the error-update files it adds.
    removes: list[tuple[str, int]] = field(default_factory=list)
    #: The deletion vector of each of ``removes`` that had one when the batch was computed.
    removed_deletion_vectors: dict[str, dict] = field(default_factory=dict)
    #: Add actions (as the log holds them) of files of ``removes`` again, each under a new
    #: deletion vector (its file written, referenced by nothing until the commit) that marks the
    #: batch's retractions in it deleted (:mod:`mvsink.write.rewrite`).
    marked: list[dict] = field(default_factory=list)
    error_files: list[StagedFile] = field(default_factory=list)
    #: Updates the batch writes (data rows added and removed, error updates).
    updates: int | None = None

    @property
    def num_records(self) -> int:
        """The updates the batch writes (in the update layout, its files' rows)."""
        return sum(f.num_records for f in self.files) if self.updates is None else self.updates

    @property
    def empty(self) -> bool:
        return not (self.files or self.removes or self.error_files or self.marked)

    def delete(self) -> None:
        """Remove the staged files and deletion vector files (after losing the race); missing
        files are fine."""
        fs, root = storage.filesystem(self.target)
        paths = [storage.join(root, f.path) for f in self.files + self.error_files]
        paths += [storage.filesystem(file_uri(self.target, add["deletionVector"]))[1] for add in self.marked]
        for path in paths:
            try:
                storage.retrying(f"deleting staged file {path}", _delete_if_exists, fs, path)
            except storage.StorageUnavailable as exc:
                # Not committed by anyone: cleanup (a data file) or VACUUM (a deletion vector
                # file) deletes it later.
                log.warning("could not delete staged file %s, left for cleanup: %s", path, exc)
        log.info("deleted %d staged files of %s", len(paths), self.desc)


def _delete_if_exists(fs, path: str) -> None:
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass


def staged_prefix(view_id: str, desc: Description, replica_id: str) -> str:
    return f"{STAGED_PREFIX}{view_id}-{desc.lower}-{desc.upper}-{replica_id}-{uuid.uuid4().hex[:12]}"


def batch_updates(corrections: DataFrame, desc: Description, corrections_since: int) -> DataFrame:
    """The updates of the batch for ``desc``: times in `[lower, upper)`, consolidated."""
    before_upper = corrections.where(F.col(TIME) < F.lit(desc.upper))
    if corrections_since >= desc.lower:
        return before_upper  # already at or past lower, and consolidated
    advanced = before_upper.withColumn(TIME, F.greatest(F.col(TIME), F.lit(desc.lower).cast("long")))
    return consolidate(advanced)


def stage(updates: DataFrame, desc: Description, target: str, view_id: str, replica_id: str,
          key_ranges: KeyRanges | None = None, plain_columns: list[str] | None = None,
          order_by: str | None = None) -> StagedBatch:
    """Write ``updates`` into ``target``'s directory, one file per non-empty Spark partition.

    With ``key_ranges``, each task also reports its file's key range
    (:meth:`~mvsink.desired.key_check.KeyRanges.report_partition`), so that whether the updates' keys are
    unique is known without reading them again (:attr:`StagedBatch.key_reports`).

    With ``plain_columns`` (the table layout; ``updates`` hold no negative diff of an ok row), a
    task writes its ok rows as plain rows (those columns, a row repeated as often as its diff
    says) and its error updates as they are into a file of its own under :data:`ERRORS_DIR`.
    With ``order_by``, each file's rows are in that column's order (a sort within each Spark
    partition, no shuffle; see :func:`sort_column`)."""
    prefix = staged_prefix(view_id, desc, replica_id)
    if order_by is not None:
        updates = updates.sortWithinPartitions(order_by)
    schema = _FILE_LIST_SCHEMA if key_ranges is None else T.StructType(
        _FILE_LIST_SCHEMA.fields + key_ranges.schema.fields)
    writer = _partition_writer(target, prefix, key_ranges, plain_columns, to_arrow_schema(schema))
    started = time.monotonic()
    rows = updates.mapInArrow(writer, schema).collect()

    def files(errors: bool) -> list[StagedFile]:
        return [StagedFile(r.path, r.size, r.num_records, r.stats) for r in rows if r.errors == errors]

    batch = StagedBatch(desc, target, files(False),
                        [r for r in rows if r.n is not None] if key_ranges is not None else [],
                        error_files=files(True),
                        updates=sum(r.updates for r in rows) if plain_columns is not None else None)
    log.info(
        "staged %d updates in %d files for %s in %.2fs",
        batch.num_records, len(batch.files), desc, time.monotonic() - started,
    )
    failpoints.hit("after-stage")
    return batch


def _partition_writer(target: str, prefix: str, key_ranges: KeyRanges | None,
                      plain_columns: list[str] | None, out_schema: pa.Schema):
    """The function each Spark task runs: stream its Arrow batches into one Parquet file (and
    fold them into a key report); in the table layout (``plain_columns``), its ok rows as plain
    rows into one file and its error updates into another (:func:`stage`)."""

    def write_partition(batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        name = f"{prefix}-{context.partitionId():05d}-{context.attemptNumber()}.parquet"
        keys = key_ranges.report() if key_ranges is not None else None
        given = 0
        data = _FileWriter(target, name)
        errors = _FileWriter(target, f"{ERRORS_DIR}/{name}") if plain_columns is not None else None
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                given += batch.num_rows
                if keys is not None:
                    keys.add(batch)
                if errors is None:
                    data.write(batch)
                    continue
                ok = pc.is_null(batch.column(ERROR))
                errors.write(batch.filter(pc.invert(ok)))
                data.write(plain_rows(batch.filter(ok), plain_columns))
            files = [(data.close(), False)] + ([(errors.close(), True)] if errors is not None else [])
        except BaseException:
            data.abort()
            if errors is not None:
                errors.abort()
            raise
        report = keys.values() if keys is not None and keys.rows else None
        for row, is_errors in files:
            if row is None:
                continue
            row = {**row, "errors": pa.array([is_errors]), "updates": pa.array([given], pa.int64())}
            given = 0
            if report is not None:
                row, report = {**row, **report}, None
            elif keys is not None:
                row = {**row, **{f.name: pa.nulls(1, out_schema.field(f.name).type) for f in key_ranges.schema.fields}}
            yield pa.RecordBatch.from_pydict(row, schema=out_schema)

    return write_partition


def plain_rows(batch: pa.RecordBatch, columns: list[str]) -> pa.RecordBatch:
    """Ok updates (positive diffs) as the table layout stores them: ``columns`` only, each row
    repeated as often as its diff says."""
    diffs = batch.column(DIFF).to_numpy(zero_copy_only=False)
    if (diffs < 1).any():
        raise ValueError("a plain row cannot hold a negative or zero diff")
    rows = batch.select(columns)
    if (diffs == 1).all():
        return rows
    return rows.take(pa.array(np.repeat(np.arange(len(diffs)), diffs)))


def sort_column(column: str, schema: T.StructType) -> str | None:
    """The column a table-layout view's files are sorted by: ``column`` (the view's prune column:
    its key's first column, else its first column), where Spark and Arrow can order it (not a
    map, list or struct); None otherwise.

    Sorted, each row group of a file covers a narrow range of it, so a lookup by key reads one
    row group per file; the rewrites find a retraction's files by the same column's statistics
    (:mod:`mvsink.write.rewrite`)."""
    kind = schema[column].dataType if column in schema.fieldNames() else None
    if kind is None or isinstance(kind, (T.MapType, T.ArrayType, T.StructType)):
        return None
    return column


def sorted_rows(rows: pa.Table, column: str | None) -> pa.Table:
    """``rows`` in ``column``'s order, nulls first (as Spark sorts them); as they are without a
    column."""
    if column is None or rows.num_rows < 2:
        return rows
    try:
        return rows.sort_by([(column, "ascending", "at_start")])
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):  # a type Arrow cannot order
        return rows


#: Rows of a file's first batch whose distinct values choose its columns' encoding.
_DICTIONARY_SAMPLE = 10_000


def dictionary_columns(first: pa.RecordBatch) -> list[str]:
    """The columns a staged file dictionary-encodes: the flat ones with at most half as many
    distinct values as values in ``first`` (its first rows). A column of mostly distinct values
    (a key, a hash) would fill the dictionary page and fall back to plain pages anyway, and
    trying costs as much as the rest of the file's writing (as Spark's writer, its pages are
    plain then); nested columns are not dictionary-encoded."""
    sample = first.slice(0, _DICTIONARY_SAMPLE)
    chosen = []
    for spec, column in zip(sample.schema, sample.columns):
        if pa.types.is_nested(spec.type) or column.null_count == len(column):
            continue
        try:
            distinct = pc.count_distinct(column).as_py()
        except pa.ArrowNotImplementedError:  # a type Arrow cannot count: the writer's default
            distinct = 0
        if distinct * 2 <= len(column) - column.null_count:
            chosen.append(spec.name)
    return chosen


class _FileWriter:
    """One staged Parquet file with its Delta statistics, opened by its first non-empty batch.

    Batches are buffered into row groups of :data:`ROW_GROUP_ROWS` rows or about
    :data:`ROW_GROUP_BYTES` (Spark hands a task batches of 10,000 rows; a row group each would
    make the file slow to write and to read). The
    file carries a page index (column and offset indexes, as Spark's Parquet writer writes them):
    a reader looking up a key skips the pages whose bounds exclude it, which made DuckDB's lookup
    of one key in a 500,000-row file about 2x faster.
    On an object store the file is written locally first and then uploaded, so that an upload
    failing transiently can be tried again (the rows stream by only once)."""

    def __init__(self, target: str, name: str):
        self.target, self.name = target, name
        self.remote = storage.is_s3(target)
        self.writer = self.sink = self.stats = self.local_dir = None
        self.buffered: list[pa.RecordBatch] = []
        self.buffered_rows = self.buffered_bytes = 0

    def _open(self, first: pa.RecordBatch) -> None:
        schema = first.schema
        fs, root = storage.filesystem(self.target)
        if self.remote:
            self.local_dir = tempfile.mkdtemp(prefix="mvsink-stage-")
            out_fs, out_path = pafs.LocalFileSystem(), os.path.join(self.local_dir, os.path.basename(self.name))
        else:
            out_fs, out_path = fs, storage.join(root, self.name)
            if "/" in self.name:
                fs.create_dir(storage.join(root, self.name.rsplit("/", 1)[0]), recursive=True)
        self.sink = out_fs.open_output_stream(out_path)
        self.writer = pq.ParquetWriter(self.sink, schema, compression="snappy", write_page_index=True,
                                       use_dictionary=dictionary_columns(first))
        self.stats = FileStats(schema)
        self.out_path = out_path

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self.writer is None:
            self._open(batch)
        self.buffered.append(batch)
        self.buffered_rows += batch.num_rows
        self.buffered_bytes += batch.nbytes
        if self.buffered_rows >= ROW_GROUP_ROWS or self.buffered_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self, last: bool = False) -> None:
        """Write the buffered rows as row groups; all of them if ``last``, else the full row
        groups (a smaller rest stays buffered, unless it is held back by bytes)."""
        if not self.buffered:
            return
        rows = pa.Table.from_batches(self.buffered)
        take = rows.num_rows
        if not last and self.buffered_bytes < ROW_GROUP_BYTES:
            take -= rows.num_rows % ROW_GROUP_ROWS
        if take:
            self.writer.write_table(rows.slice(0, take), row_group_size=ROW_GROUP_ROWS)
            self.stats.add(rows.slice(0, take))
        rest = rows.slice(take)
        self.buffered = rest.to_batches() if rest.num_rows else []
        self.buffered_rows, self.buffered_bytes = rest.num_rows, rest.nbytes if rest.num_rows else 0

    def close(self) -> dict | None:
        """Finish the file (upload it, on an object store); its file-list row, None if empty."""
        if self.writer is None:
            return None
        try:
            self._flush(last=True)
            self.writer.close()
            self.sink.close()
            fs, root = storage.filesystem(self.target)
            path = storage.join(root, self.name)
            if self.remote:
                size = os.path.getsize(self.out_path)
                storage.retrying(f"uploading staged file {self.name}", _upload, self.out_path, fs, path)
            else:
                size = fs.get_file_info(path).size
        finally:
            self._remove_local()
        return {"path": pa.array([self.name]), "size": pa.array([size], pa.int64()),
                "num_records": pa.array([self.stats.num_records], pa.int64()),
                "stats": pa.array([self.stats.to_json()])}

    def abort(self) -> None:
        self.buffered = []
        if self.writer is not None:
            try:
                self.writer.close()
                self.sink.close()
            except Exception:
                pass
        self._remove_local()

    def _remove_local(self) -> None:
        if self.local_dir is not None:
            shutil.rmtree(self.local_dir, ignore_errors=True)
            self.local_dir = None


def _upload(local_path: str, fs, path: str) -> None:
    with open(local_path, "rb") as source, fs.open_output_stream(path) as sink:
        shutil.copyfileobj(source, sink, 8 << 20)
