"""Reading a view: its consolidated contents at a time, its upper and since.

The view at time `t` is the consolidation of the table's updates with time <= `t`. It is only
defined for `since <= t < upper`: below ``since`` (the view's ``as_of``) the table holds nothing
for it, and at or past the upper the view may still change. The table can also say that the view
is *in error* at `t` (error updates); reading then raises :class:`ViewInError` unless asked for
the ok rows anyway.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink.append import Shard
from mvsink.inputs import latest_version, spark_uri
from mvsink.updates import ERROR, RESERVED, contents_at, normalize


class ViewInError(RuntimeError):
    """The view has error updates at the time read; the messages say why."""


class NotReadable(ValueError):
    """The time asked for is outside `[since, upper)`."""


def _shard(target: str, view_id: str) -> Shard:
    return Shard(target, f"mvsink:{view_id}", view_id, "reader")


def view_upper(target: str, view_id: str) -> int:
    """The view's upper: all times below it are final."""
    return _shard(target, view_id).upper() if latest_version(target) is not None else 0


def view_since(target: str, view_id: str) -> int:
    """The earliest readable time: the time of the first write (the view's ``as_of``)."""
    if latest_version(target) is None:
        return 0
    table = _shard(target, view_id).table()
    for info in reversed(table.history()):
        if info.get("mvsink.view") == view_id and info.get("mvsink.reason") != "advance-upper":
            return int(info["mvsink.lower"])
    return view_upper(target, view_id)


def updates(spark: SparkSession, target: str, version: int | None = None) -> DataFrame:
    """All updates in the table (at table ``version``, default latest), foreign nulls normalized."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    table = reader.load(spark_uri(target))
    return normalize(table, table.schema)


def read_view(spark: SparkSession, target: str, view_id: str, time: int | None = None,
              errors: str = "raise") -> DataFrame:
    """The view's rows at ``time`` (default: the latest final time, `upper - 1`).

    ``errors``: "raise" (the default) raises :class:`ViewInError` if the view is in error at
    ``time``; "ignore" returns the ok rows regardless.
    """
    upper = view_upper(target, view_id)
    since = view_since(target, view_id)
    time = upper - 1 if time is None else time
    if not since <= time < upper:
        raise NotReadable(f"view {view_id!r} is readable at times [{since}, {upper}), not at {time}")
    contents = contents_at(updates(spark, target), time)
    if errors == "raise":
        messages = [r[ERROR] for r in contents.where(F.col(ERROR).isNotNull()).select(ERROR).limit(5).collect()]
        if messages:
            raise ViewInError(f"view {view_id!r} is in error at time {time}: " + " | ".join(messages))
    elif errors != "ignore":
        raise ValueError(f"errors must be 'raise' or 'ignore', not {errors!r}")
    user = [c for c in contents.columns if c not in RESERVED]
    return contents.where(F.col(ERROR).isNull()).select(*user)


def view_errors(spark: SparkSession, target: str, time: int) -> DataFrame:
    """The error messages of the view at ``time`` (one row per error update copy)."""
    return contents_at(updates(spark, target), time).where(F.col(ERROR).isNotNull()).select(ERROR)


def register_temp_view(spark: SparkSession, target: str, view_id: str, name: str | None = None,
                       time: int | None = None) -> str:
    """Register the view at ``time`` as a temporary SQL view; returns its name."""
    name = name or view_id
    read_view(spark, target, view_id, time).createOrReplaceTempView(name)
    return name
