"""A source at a version read from only the files whose statistics can hold a change's keys, listed without Spark.

Delta prepares a filtered scan with Spark jobs over the snapshot's file statistics: 0.15-0.3 s a
scan on 2 cores, twice on a version not read before, most of a small join step's time. Where a
table is plain Parquet -- protocol reader version 1 (no deletion vectors, no column mapping) and
no partition columns -- its rows at a version are exactly the rows of its add actions' files, read
with its schema. So the files are listed here from the log by delta-rs, in this process, once per
version, and those whose min/max statistics of a key column lie outside every range of the change
are left out (unless nulls are asked for and the file may hold one). A file without statistics for
the column is kept, and so is every file where the column is not an integer, date, decimal or
string (of Spark's binary collation); a string statistic bounds only where it is plainly a value
(:func:`mvsink.file_stats.bounds`). The keys are a join's other side's (the change's join keys)
or a per-group aggregate's groups (the changed groups' values). The caller still filters the rows
by the ranges (:func:`~mvsink.desired.join.pruned`): leaving out a file only skips rows none of
which is asked for. Any table this cannot read (another protocol, partitions, a log delta-rs
fails on) is read through Delta as before.
"""

from __future__ import annotations

import datetime
import logging
from decimal import Decimal

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from mvsink import storage
from mvsink.file_stats import bounds, overlaps
from mvsink.table import file_uri

log = logging.getLogger(__name__)

#: Column types whose file statistics prune here, and the Python types of their values.
_PRUNED_TYPES = ((T.ByteType, T.ShortType, T.IntegerType, T.LongType), (T.DateType,), (T.DecimalType,),
                 (T.StringType,))
_VALUE_TYPES = (int, datetime.date, Decimal, str)
_GLOB = "*?[]{}\\"
_CHAR_VARCHAR = "__CHAR_VARCHAR_TYPE_STRING"


def prunes(data_type: T.DataType) -> bool:
    """Whether :func:`files_in_ranges` prunes files by ranges of a column of ``data_type``
    (integers, dates, decimals, strings compared as Spark's binary collation does)."""
    if isinstance(data_type, T.StringType) and data_type.collation != "UTF8_BINARY":
        return False
    return any(isinstance(data_type, kinds) for kinds in _PRUNED_TYPES)


def add_actions(path: str, version: int) -> pa.Table | None:
    """The add actions (flattened: ``path``, ``min.<column>``, ``max.<column>``) of the table at
    ``path`` at ``version``, or None where its files are not plain Parquet (see the module doc)
    or delta-rs cannot read its log."""
    try:
        table = DeltaTable(storage.delta_uri(path), version=version, storage_options=storage.storage_options(path))
        if not is_plain(table):
            return None
        actions = table.get_add_actions(flatten=True)
    except Exception as exc:  # read through Delta instead: slower, never wrong
        log.debug("source %s at version %d: files not listed by delta-rs (%s)", path, version, exc)
        return None
    # Spark globs the paths it is given: a name with a glob character is read through Delta.
    if any(c in name for name in [path, *actions.column("path").to_pylist()] for c in _GLOB):
        return None
    return actions


def is_plain(table: DeltaTable) -> bool:
    """Whether ``table``'s rows are exactly the rows of its add actions' files, read with its
    schema: protocol reader version 1 (no deletion vectors, no column mapping), no partition columns."""
    return table.protocol().min_reader_version == 1 and not table.metadata().partition_columns


def files_in_ranges(path: str, actions: pa.Table, schema: T.StructType,
                    cuts: list[tuple[str, list[tuple], bool]]) -> list[str]:
    """The URIs of the files of ``actions`` (of the table at ``path``, whose columns are
    ``schema``) that may hold, for each ``(column, ranges, nulls)`` of ``cuts``, a value in one of
    its closed ranges, or with ``nulls`` a null (a file whose null count is not 0 or not known)."""
    paths = actions.column("path").to_pylist()
    keep = [True] * len(paths)
    names = set(actions.column_names)
    for column, ranges, nulls in cuts:
        if not prunes(schema[column].dataType):
            continue
        if f"min.{column}" not in names or f"max.{column}" not in names:
            continue
        lows, highs = actions.column(f"min.{column}").to_pylist(), actions.column(f"max.{column}").to_pylist()
        null_counts = (actions.column(f"null_count.{column}").to_pylist() if f"null_count.{column}" in names
                       else [None] * len(paths))
        for i, (low, high, null_count) in enumerate(zip(lows, highs, null_counts)):
            low, high = bounds(low, high)
            if keep[i] and _comparable(low, ranges) and (high is None or _comparable(high, ranges)):
                keep[i] = overlaps(low, high, ranges) or (nulls and null_count != 0)
    return [file_uri(path, p) for p, kept in zip(paths, keep) if kept]


def readable(schema: T.StructType) -> bool:
    """Whether rows of ``schema`` are read from their files here: not where it has a
    ``CHAR``/``VARCHAR`` column, whose reads Spark pads by the schema's metadata (left to Delta's
    reader)."""
    return _CHAR_VARCHAR not in schema.json()


def read_files(spark: SparkSession, uris: list[str], schema: T.StructType) -> DataFrame | None:
    """The rows of the Parquet files ``uris`` in ``schema`` (no file: no rows); None where the
    schema is not :func:`readable` here."""
    if not readable(schema):
        return None
    if not uris:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*uris)


def _comparable(value, ranges: list[tuple]) -> bool:
    """Whether a statistic ``value`` compares exactly with the ranges' bounds: both of one of the
    types pruned here (a missing statistic does not)."""
    if value is None or isinstance(value, bool):
        return False
    kind = next((k for k in _VALUE_TYPES if isinstance(value, k)), None)
    return kind is not None and all(isinstance(b, kind) and not isinstance(b, bool) for r in ranges for b in r)

