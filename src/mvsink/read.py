"""Reading a view: its consolidated contents at a time, its upper and since.

The view at time `t` is the consolidation of the table's updates with time <= `t`. It is only
defined for `since <= t < upper`: below ``since`` the table holds nothing for it (before the first
write, the view's ``as_of``) or no longer tells the times apart (a compaction advanced them), and
at or past the upper the view may still change. The table can also say that the view is *in
error* at `t` (error updates); reading then raises :class:`ViewInError` unless asked for the ok
rows anyway.
"""

from __future__ import annotations

from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from mvsink import storage
from mvsink.append import (META_LOWER, META_REASON, META_SINCE, META_VIEW, REASON_ADVANCE_UPPER,
                           REASON_COMPACTION, Shard)
from mvsink.table import latest_version, spark_uri
from mvsink.updates import DIFF, ERROR, RESERVED, TIME, contents_at, normalize


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
    """The earliest readable time: the latest compaction's since, else the first write's lower."""
    if latest_version(target) is None:
        return 0
    shard = _shard(target, view_id)
    table = shard.table()
    since = since_of(table, view_id)
    return shard.upper_of(table) if since is None else since


def since_of(table: DeltaTable, view_id: str) -> int | None:
    """The view's since in ``table``'s snapshot; None if the view has written nothing yet.

    The history is read newest first and the search stops at the newest compaction: a compaction
    needs a write before it and only ever raises the since, so its since is past the first lower.
    delta-rs' history may also return commits newer than the snapshot; as the since only grows,
    that at worst reports the newer since (a compaction based on the snapshot then stops or
    conflicts).
    """
    first_lower = None
    for info in newest_first(table):
        if info.get(META_VIEW) != view_id:
            continue
        if info.get(META_REASON) == REASON_COMPACTION:
            return int(info[META_SINCE])
        if info.get(META_REASON) != REASON_ADVANCE_UPPER:
            first_lower = int(info[META_LOWER])
    return first_lower


def newest_first(table: DeltaTable, first_chunk: int = 64):
    """The table's commit infos, newest first, read in growing chunks."""
    seen, limit = 0, first_chunk
    while True:
        infos = storage.retrying(f"reading the history of {table.table_uri}", table.history, limit)
        yield from infos[seen:]
        if len(infos) < limit:
            return
        seen, limit = len(infos), limit * 8


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


#: How each engine names a Delta table at a path and repeats a row `n` times.
_DIALECTS = {
    "duckdb": ("delta_scan('{path}')", "AS v, range(v._mv_n)"),
    "spark": ("delta.`{path}`", "AS v LATERAL VIEW explode(sequence(1, v._mv_n)) r AS _mv_copy"),
    "trino": ("{table}", "AS v CROSS JOIN UNNEST(sequence(1, v._mv_n)) AS r(_mv_copy)"),
}


def plain_sql(target: str, time: int | None = None, dialect: str = "duckdb", table: str | None = None) -> str:
    """SQL that shows the view's rows to an engine that knows nothing of mvsink.

    The view at ``time`` (default: the latest, `upper - 1`, which needs no filter: every update
    in the table has a time below the upper) is the sum of the ``_mv_diff`` of each row's updates
    with ``_mv_time <= time``, without error updates; a row is listed as often as that sum says.
    ``dialect``: ``duckdb`` (``delta_scan`` of the target; the delta extension), ``spark``
    (``delta.`path```), or ``trino`` (``table``: the target's name in the Trino catalog). The
    result is the view only at times in `[since, upper)` (:func:`view_since`, :func:`view_upper`).
    """
    if dialect not in _DIALECTS:
        raise ValueError(f"dialect must be one of {sorted(_DIALECTS)}, not {dialect!r}")
    if dialect == "trino" and not table:
        raise ValueError("the trino dialect needs table: the target's name in the Trino catalog")
    if latest_version(target) is None:
        raise ValueError(f"{target} is not a Delta table")
    source, repeat = _DIALECTS[dialect]
    schema = storage.retrying(f"loading {target}", DeltaTable, storage.delta_uri(target),
                              storage_options=storage.storage_options(target)).schema()
    columns = ", ".join(f'"{f.name}"' if dialect != "spark" else f"`{f.name}`"
                        for f in schema.fields if f.name not in RESERVED)
    where = f"{ERROR} IS NULL" + ("" if time is None else f" AND coalesce({TIME}, 0) <= {int(time)}")
    return (f"SELECT {columns} FROM (SELECT {columns}, CAST(sum(coalesce({DIFF}, 1)) AS BIGINT) AS _mv_n "
            f"FROM {source.format(path=spark_uri(target) if dialect == 'spark' else target, table=table)} WHERE {where} GROUP BY {columns} "
            f"HAVING sum(coalesce({DIFF}, 1)) > 0) {repeat}")
