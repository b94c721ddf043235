"""The sources and views of a check read as a reader that is neither Spark's Delta reader nor
mvsink's reads them: delta-rs, its rows then held in the session for Spark's SQL.

Spark's time travel builds each version's snapshot with a Spark job, and its optimizer prepares
the scans of a union of many versions all at once (Delta's ``PrepareDeltaScan``): a check's
union of 20 times of a two-table join spent 7 s there and 1 s running; read by delta-rs, 1.4 s
in all. An S3 table is read by Spark."""

from __future__ import annotations


def source_at(spark, path: str, version: int):
    """The Delta table at ``path`` as of ``version``, its rows held in ``spark``'s session. A
    table with the deletion-vector feature is read through delta-rs's ``QueryBuilder``
    (``to_pyarrow_table`` refuses it), whose string and binary views PySpark cannot take."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder
    from deltalake.exceptions import DeltaProtocolError

    if "://" in path:
        return spark.read.format("delta").option("versionAsOf", version).load(path)
    table = DeltaTable(path, version=version)
    try:
        rows = table.to_pyarrow_table()
    except DeltaProtocolError:
        rows = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
        rows = rows.cast(pa.schema([pa.field(f.name, _without_views(f.type), f.nullable) for f in rows.schema]))
    return spark.createDataFrame(rows)


def view_at(spark, target: str, view_id: str, time: int, errors: str = "raise"):
    """The table-layout view ``view_id`` at ``time`` as a plain reader reads it: its table at
    the version holding ``time`` (:func:`mvsink.version_of_time`; a violated key's rows are not
    in it). ``errors`` as :func:`mvsink.read_view`'s: "raise" raises :class:`mvsink.ViewInError`
    where the view is in error at ``time`` (:func:`mvsink.view_errors`), "ignore" does not look."""
    from mvsink import ViewInError, version_of_time, view_errors

    if errors == "raise":
        messages = [row[0] for row in view_errors(spark, target, time, view_id).take(5)]
        if messages:
            raise ViewInError(f"view {view_id!r} is in error at time {time}: " + " | ".join(messages))
    return source_at(spark, target, version_of_time(target, view_id, time))


def _without_views(t):
    """Arrow type ``t`` with its string and binary views (at any depth) as plain strings and binaries."""
    import pyarrow as pa

    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _without_views(t.value_type), t.value_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _without_views(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_without_views(t.key_type), _without_views(t.item_type))
    return t
