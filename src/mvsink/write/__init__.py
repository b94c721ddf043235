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

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink import failpoints, storage
from mvsink.mint import Description
from mvsink.updates import TIME, consolidate
from mvsink.write.stats import FileStats

if TYPE_CHECKING:
    from mvsink.key_check import KeyRanges

log = logging.getLogger(__name__)

STAGED_PREFIX = "mvsink-"

_FILE_LIST_SCHEMA = T.StructType(
    [
        T.StructField("path", T.StringType()),
        T.StructField("size", T.LongType()),
        T.StructField("num_records", T.LongType()),
        T.StructField("stats", T.StringType()),
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
    files: list[StagedFile] = field(default_factory=list)
    #: Each file's key report, where the staging was asked for one (see :func:`stage`).
    key_reports: list = field(default_factory=list)

    @property
    def num_records(self) -> int:
        return sum(f.num_records for f in self.files)

    def delete(self) -> None:
        """Remove the staged files (after losing the race); missing files are fine."""
        fs, root = storage.filesystem(self.target)
        for f in self.files:
            try:
                storage.retrying(f"deleting staged file {f.path}", _delete_if_exists, fs,
                                 storage.join(root, f.path))
            except storage.StorageUnavailable as exc:
                # Not committed by anyone: cleanup deletes it once it is older than the grace.
                log.warning("could not delete staged file %s, left for cleanup: %s", f.path, exc)
        log.info("deleted %d staged files of %s", len(self.files), self.desc)


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
          key_ranges: KeyRanges | None = None) -> StagedBatch:
    """Write ``updates`` into ``target``'s directory, one file per non-empty Spark partition.

    With ``key_ranges``, each task also reports its file's key range
    (:meth:`~mvsink.key_check.KeyRanges.report_partition`), so that whether the updates' keys are
    unique is known without reading them again (:attr:`StagedBatch.key_reports`)."""
    prefix = staged_prefix(view_id, desc, replica_id)
    writer = _partition_writer(target, prefix, key_ranges)
    schema = _FILE_LIST_SCHEMA if key_ranges is None else T.StructType(
        _FILE_LIST_SCHEMA.fields + key_ranges.schema.fields)
    started = time.monotonic()
    rows = updates.mapInArrow(writer, schema).collect()
    batch = StagedBatch(desc, target, [StagedFile(r.path, r.size, r.num_records, r.stats) for r in rows],
                        rows if key_ranges is not None else [])
    log.info(
        "staged %d updates in %d files for %s in %.2fs",
        batch.num_records, len(batch.files), desc, time.monotonic() - started,
    )
    failpoints.hit("after-stage")
    return batch


def _partition_writer(target: str, prefix: str, key_ranges: KeyRanges | None):
    """The function each Spark task runs: stream its Arrow batches into one Parquet file (and
    fold them into a key report)."""

    def write_partition(batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        name = f"{prefix}-{context.partitionId():05d}-{context.attemptNumber()}.parquet"
        fs, root = storage.filesystem(target)
        path = storage.join(root, name)
        remote = storage.is_s3(target)
        local_dir = tempfile.mkdtemp(prefix="mvsink-stage-") if remote else None
        # On an object store the file is written locally first and then uploaded, so that an
        # upload failing transiently can be tried again (the rows stream by only once).
        out_fs, out_path = (pafs.LocalFileSystem(), os.path.join(local_dir, name)) if remote else (fs, path)
        writer = None
        stats = None
        sink = None
        keys = key_ranges.report() if key_ranges is not None else None
        try:
            try:
                for batch in batches:
                    if batch.num_rows == 0:
                        continue
                    if writer is None:
                        sink = out_fs.open_output_stream(out_path)
                        writer = pq.ParquetWriter(sink, batch.schema, compression="snappy")
                        stats = FileStats(batch.schema)
                    writer.write_batch(batch)
                    stats.add(batch)
                    if keys is not None:
                        keys.add(batch)
            finally:
                if writer is not None:
                    writer.close()
                    sink.close()
            if writer is not None:
                if remote:
                    size = os.path.getsize(out_path)
                    storage.retrying(f"uploading staged file {name}", _upload, out_path, fs, path)
                else:
                    size = fs.get_file_info(path).size
        finally:
            if local_dir is not None:
                shutil.rmtree(local_dir, ignore_errors=True)
        if writer is not None:
            row = {"path": pa.array([name]), "size": pa.array([size], pa.int64()),
                   "num_records": pa.array([stats.num_records], pa.int64()),
                   "stats": pa.array([stats.to_json()])}
            yield pa.RecordBatch.from_pydict({**row, **(keys.values() if keys is not None else {})})

    return write_partition


def _upload(local_path: str, fs, path: str) -> None:
    with open(local_path, "rb") as source, fs.open_output_stream(path) as sink:
        shutil.copyfileobj(source, sink, 8 << 20)
