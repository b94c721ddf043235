"""`plain`: stages a table-layout batch: the files that make the table the view at the batch's upper.

A batch of the table layout (:mod:`mvsink.target.layout`) holds ok updates (rows with their diffs) and
error updates. Staged, nothing committed:

* a retraction (diff `-k`) as rewrites of the files holding `k` copies of the row, or with
  ``mark`` as deletion vectors marking them deleted (:mod:`mvsink.write.rewrite`);
* an insertion (diff `+k`) as `k` plain rows (the view's columns only);
* error updates as they are, in a file under :data:`~mvsink.write.ERRORS_DIR`.

Two ways, chosen by the batch's size:

* *gathered*: a batch of at most :data:`GATHERED_UPDATES` updates written to a table that has
  files is collected to the driver in one Spark job. The files holding its retractions are
  rewritten by one task each (by the driver where they are small) with the inserted rows folded
  into them (:func:`~mvsink.write.rewrite.rewrite_gathered`), so a step that rewrites files adds
  none and the file count stays where the table's rows put it; the inserted rows no rewrite took
  and the error updates are written by the driver, one file each. One or two Spark jobs a step.
* *distributed*: a larger batch, a first write, or one whose files' key ranges are asked for
  (:class:`~mvsink.desired.key_check.KeyRanges`) never reaches the driver: the retractions are found by a
  Spark join (:func:`~mvsink.write.rewrite.rewrite_retractions`) and the rest is written by the
  tasks that hold it (:func:`~mvsink.write.stage`).

Both end at the failpoint ``after-stage``, like :func:`~mvsink.write.stage`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import failpoints
from mvsink.mint import Description
from mvsink.updates import DIFF, ERROR
from mvsink.write import (ERRORS_DIR, StagedBatch, StagedFile, _FileWriter, plain_rows, sort_column, sorted_rows, stage,
                          staged_prefix)
from mvsink.write.rewrite import COPIES, TableFile, rewrite_gathered, rewrite_retractions

if TYPE_CHECKING:
    from mvsink.desired.key_check import KeyRanges

log = logging.getLogger(__name__)

#: Updates a batch may have to be staged through the driver.
GATHERED_UPDATES = 200_000


def stage_plain(spark: SparkSession, updates: DataFrame, desc: Description, target: str, view_id: str,
                replica_id: str, table_files: list[TableFile], columns: list[str], prune_column: str,
                key_ranges: KeyRanges | None = None, mark: bool = False) -> StagedBatch:
    """Stage ``updates`` (the batch for ``desc``) against ``table_files`` (the table's data files
    as the read-back saw them; with ``mark``, each with its add action); see the module doc.
    Every data file staged holds its rows in the order of ``prune_column``
    (:func:`~mvsink.write.sort_column`)."""
    prefix = staged_prefix(view_id, desc, replica_id)
    order_by = sort_column(prune_column, updates.schema)
    if table_files and key_ranges is None:
        started = time.monotonic()
        gathered = updates.limit(GATHERED_UPDATES + 1).toArrow()
        if gathered.num_rows <= GATHERED_UPDATES:
            return _stage_gathered(spark, gathered, desc, target, table_files, columns, prune_column, order_by,
                                   prefix, time.monotonic() - started, mark)
    rewrites = None
    if table_files:
        retractions = updates.where(F.col(ERROR).isNull() & (F.col(DIFF) < 0))
        rewrites = rewrite_retractions(spark, retractions, table_files, target, prefix, columns, prune_column, mark)
        updates = updates.where(F.col(ERROR).isNotNull() | (F.col(DIFF) > 0))
    batch = stage(updates, desc, target, view_id, replica_id, key_ranges, plain_columns=columns, order_by=order_by)
    if rewrites is not None:
        batch.files += rewrites.files
        batch.removes, batch.removed_deletion_vectors = rewrites.removes, rewrites.removed_deletion_vectors
        batch.marked = rewrites.marked
        batch.updates += rewrites.retractions
    return batch


def _stage_gathered(spark: SparkSession, updates: pa.Table, desc: Description, target: str,
                    table_files: list[TableFile], columns: list[str], prune_column: str,
                    order_by: str | None, prefix: str, gathering: float, mark: bool) -> StagedBatch:
    started = time.monotonic()
    ok = pc.is_null(updates.column(ERROR))
    rows = updates.filter(ok)
    negative = pc.less(rows.column(DIFF), 0)
    retractions = rows.filter(negative)
    inserts = pa.Table.from_batches([plain_rows(b, columns) for b in rows.filter(pc.invert(negative)).to_batches()],
                                    schema=rows.select(columns).schema)
    batch = StagedBatch(desc, target, updates=updates.num_rows)
    if retractions.num_rows:
        wanted = retractions.select(columns).append_column(COPIES, pc.negate(retractions.column(DIFF)))
        rewrites, inserts = rewrite_gathered(spark, wanted, inserts, table_files, target, prefix, prune_column,
                                             order_by, mark)
        batch.files, batch.removes = rewrites.files, rewrites.removes
        batch.removed_deletion_vectors, batch.marked = rewrites.removed_deletion_vectors, rewrites.marked
    rewritten = time.monotonic()
    batch.files += _write(target, f"{prefix}-driver.parquet", sorted_rows(inserts, order_by))
    batch.error_files = _write(target, f"{ERRORS_DIR}/{prefix}-driver.parquet", updates.filter(pc.invert(ok)))
    log.info("staged %d updates for %s through the driver: %d files added, %d removed (%d of them marked in "
             "deletion vectors); gathered in %.2fs, rewrites %.2fs, driver writes %.2fs", updates.num_rows, desc,
             len(batch.files), len(batch.removes), len(batch.marked), gathering, rewritten - started,
             time.monotonic() - rewritten)
    failpoints.hit("after-stage")
    return batch


def _write(target: str, name: str, rows: pa.Table) -> list[StagedFile]:
    """``rows`` staged as the file ``name`` (none if there are no rows)."""
    writer = _FileWriter(target, name)
    try:
        for batch in rows.to_batches():
            writer.write(batch)
        row = writer.close()
    except BaseException:
        writer.abort()
        raise
    return [] if row is None else [StagedFile(*(row[c][0].as_py() for c in ("path", "size", "num_records", "stats")))]
