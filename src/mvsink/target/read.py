"""Reading a view: its contents at a time, its upper and since.

In the table layout (:mod:`mvsink.target.layout`) the view at time `t` is the table at the version that
holds `t` (:func:`version_of_time`): the view's commit whose `[lower, upper)` covers `t`, read with
Delta time travel; its errors are the error files that commit lists. In the update layout:

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
from mvsink.append import Shard
from mvsink.target.commit_info import (META_LOWER, META_READBACK, META_REASON, META_SINCE, META_UPPER,
                                       META_VIEW, REASON_ADVANCE_UPPER, REASON_COMPACTION)
from mvsink.target.layout import TABLE, error_files, layout_of
from mvsink.table import CONTENT_PRESERVING, commit_info, file_uri, latest_version, spark_uri
from mvsink.updates import CLOSED, DIFF, ERROR, RESERVED, TIME, contents_at, is_error, normalize


class ViewInError(RuntimeError):
    """The view has error updates at the time read; the messages say why."""


class NotReadable(ValueError):
    """The time asked for is outside `[since, upper)`."""


def _shard(target: str, view_id: str) -> Shard:
    """A shard that only reads: it takes a target with deletion vectors (reading writes nothing)."""
    shard = Shard(target, f"mvsink:{view_id}", view_id, "reader")
    shard.deletion_vectors = True
    return shard


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
        if info.get(META_REASON) == REASON_COMPACTION and META_SINCE in info:
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


#: Why a commit of the view was made, for the commits whose version holds the view's times.
_HOLDS_TIMES = {"correction", "repair", "progress", REASON_COMPACTION}


def version_of_time(target: str, view_id: str, time: int) -> int:
    """The table version that holds the view at ``time`` (table layout): the version of the
    view's commit whose `[lower, upper)` covers ``time``. Raises :class:`NotReadable` outside
    `[since, upper)`, and where that commit landed on a foreign commit it had not read (its
    version holds the foreign change too; the next commit repaired it, at a later time)."""
    return _holding(target, view_id, time)[0]


def _holding(target: str, view_id: str, time: int) -> tuple[int, dict]:
    """:func:`version_of_time` and the commit info of that version."""
    shard = _shard(target, view_id)
    if latest_version(target) is None:
        raise NotReadable(f"view {view_id!r} has written nothing: {target} is not a table yet")
    table = shard.table()
    upper = shard.upper_of(table)
    if not time < upper:
        raise NotReadable(f"view {view_id!r} is readable at times below its upper {upper}, not at {time}")
    for version in range(table.version(), -1, -1):
        info = _commit_info(target, version)
        if info is None:
            break
        if info.get(META_VIEW) != view_id or info.get(META_REASON) not in _HOLDS_TIMES - {REASON_COMPACTION}:
            continue  # a compaction holds the rows of the commit it rearranged: take that one
        if int(info[META_UPPER]) <= time:
            break
        if not int(info[META_LOWER]) <= time:
            continue
        unread = [v for v in range(int(info.get(META_READBACK, -1)) + 1, version)
                  if (other := _commit_info(target, v)) is not None and other.get(META_VIEW) != view_id
                  and other.get("operation") not in CONTENT_PRESERVING]
        if unread:
            raise NotReadable(f"view {view_id!r} at time {time}: its version {version} also holds the foreign "
                              f"commit(s) {unread} it had not read; the view is right again from "
                              "the repair after them on")
        return version, info
    raise NotReadable(f"view {view_id!r}: no version of {target} holds time {time} (before the view's "
                      "first write, or its commit is no longer in the log)")


def _commit_info(target: str, version: int) -> dict | None:
    """The commit info of ``version`` from its own log entry (None if the entry is gone): not
    delta-rs' history(), which numbers commits newer than its snapshot from the snapshot's version."""
    try:
        return storage.retrying(f"reading version {version} of {target}", commit_info, target, version)
    except FileNotFoundError:
        return None


def view_contents(spark: SparkSession, target: str, view_id: str, time: int, version: int | None = None) -> DataFrame:
    """The view at ``time`` as rows of its columns and ``_mv_error`` (null for an ok row), a row
    as often as the view has it, in either layout; ``version`` pins the update layout's table
    version read (the table layout reads the version that holds ``time``)."""
    if layout_of(target) == TABLE:
        holding, info = _holding(target, view_id, time)
        table = spark.read.format("delta").option("versionAsOf", holding).load(spark_uri(target))
        rows = table.withColumn(ERROR, F.lit(None).cast("string"))
        errors = _error_rows(spark, target, error_files(info) or [])
        return rows if errors is None else rows.unionByName(errors.select(*rows.columns))
    return contents_at(updates(spark, target, version), time)


def _read_table_layout(spark: SparkSession, target: str, view_id: str, time: int | None,
                       errors: str) -> DataFrame:
    if time is None:
        time = view_upper(target, view_id) - 1
    version, info = _holding(target, view_id, time)
    if errors == "raise":
        messages = _error_messages(spark, target, error_files(info) or [], 5)
        if messages:
            raise ViewInError(f"view {view_id!r} is in error at time {time}: " + " | ".join(messages))
    return spark.read.format("delta").option("versionAsOf", version).load(spark_uri(target))


def _error_rows(spark: SparkSession, target: str, paths: list[str]) -> DataFrame | None:
    """The consolidated error updates of a table-layout version's error files, one row per copy."""
    if not paths:
        return None
    rows = normalize(spark.read.parquet(*[file_uri(target, p) for p in paths]),
                     spark.read.parquet(file_uri(target, paths[0])).schema)
    return contents_at(rows, CLOSED).where(is_error())


def _error_messages(spark: SparkSession, target: str, paths: list[str], most: int) -> list[str]:
    rows = _error_rows(spark, target, paths)
    return [] if rows is None else [r[ERROR] for r in rows.select(ERROR).limit(most).collect()]


def read_view(spark: SparkSession, target: str, view_id: str, time: int | None = None,
              errors: str = "raise") -> DataFrame:
    """The view's rows at ``time`` (default: the latest final time, `upper - 1`).

    ``errors``: "raise" (the default) raises :class:`ViewInError` if the view is in error at
    ``time``; "ignore" returns the ok rows regardless.
    """
    if errors not in ("raise", "ignore"):
        raise ValueError(f"errors must be 'raise' or 'ignore', not {errors!r}")
    if layout_of(target) == TABLE:
        return _read_table_layout(spark, target, view_id, time, errors)
    upper = view_upper(target, view_id)
    since = view_since(target, view_id)
    time = upper - 1 if time is None else time
    if not since <= time < upper:
        raise NotReadable(f"view {view_id!r} is readable at times [{since}, {upper}), not at {time}")
    contents = contents_at(updates(spark, target), time)
    if errors == "raise":
        messages = [r[ERROR] for r in contents.where(is_error()).select(ERROR).limit(5).collect()]
        if messages:
            raise ViewInError(f"view {view_id!r} is in error at time {time}: " + " | ".join(messages))
    user = [c for c in contents.columns if c not in RESERVED]
    return contents.where(F.col(ERROR).isNull()).select(*user)


def view_errors(spark: SparkSession, target: str, time: int, view_id: str | None = None) -> DataFrame:
    """The error messages of the view at ``time`` (one row per error update copy); in the table
    layout, of the view ``view_id`` (default: the writer of the table's newest mvsink commit)."""
    if layout_of(target) == TABLE:
        view_id = view_id or newest_view(target)
        _, info = _holding(target, view_id, time)
        rows = _error_rows(spark, target, error_files(info) or [])
        return spark.createDataFrame([], f"{ERROR} STRING") if rows is None else rows.select(ERROR)
    return contents_at(updates(spark, target), time).where(is_error()).select(ERROR)


def newest_view(target: str) -> str:
    """The view whose commit is the table's newest mvsink commit (:class:`NotReadable`: none)."""
    if latest_version(target) is None:
        raise NotReadable(f"{target} is not a Delta table")
    for info in newest_first(_shard(target, "reader").table()):
        if info.get(META_VIEW):
            return info[META_VIEW]
    raise NotReadable(f"{target} has no mvsink commit: no view wrote this table")


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
    newest_view(target)  # a view's table, or NotReadable (a ValueError) saying why not
    source, repeat = _DIALECTS[dialect]
    if layout_of(target) == TABLE:
        if time is not None:
            raise ValueError(f"{target} holds the view's rows (table layout): read time {time} at the "
                             f"version that holds it (mvsink version {target} --time {time}) with "
                             f"your engine's time travel")
        return f"SELECT * FROM {source.format(path=spark_uri(target) if dialect == 'spark' else target, table=table)}"
    schema = storage.retrying(f"loading {target}", DeltaTable, storage.delta_uri(target),
                              storage_options=storage.storage_options(target)).schema()
    columns = ", ".join(f'"{f.name}"' if dialect != "spark" else f"`{f.name}`"
                        for f in schema.fields if f.name not in RESERVED)
    where = f"{ERROR} IS NULL" + ("" if time is None else f" AND coalesce({TIME}, 0) <= {int(time)}")
    return (f"SELECT {columns} FROM (SELECT {columns}, CAST(sum(coalesce({DIFF}, 1)) AS BIGINT) AS _mv_n "
            f"FROM {source.format(path=spark_uri(target) if dialect == 'spark' else target, table=table)} WHERE {where} GROUP BY {columns} "
            f"HAVING sum(coalesce({DIFF}, 1)) > 0) {repeat}")
