"""Peeks: one-off reads of a view's consolidated contents at a time `t`, for the replica protocol.

Invariants:

* A peek answers only for ``since <= t < upper``. Below the since it fails with :class:`PeekError`
  (before the view's first write, or compacted away: waiting does not help); at or past the upper
  with :class:`PeekNotReady` (the caller waits for the upper and retries). The upper is read
  first, then the table version read is pinned, then the since is read: the pinned version holds
  every update below the upper, and a compaction (which only raises the since and changes nothing
  at or past it) that commits meanwhile can only make the peek fail, never change its rows.
* Nothing runs on the cluster before the request is known to be good: its fields, the projection
  (exact names of the view's user columns) and the filter (analysed by Spark against a relation of
  the user columns alone, so mvsink's ``_mv_*`` columns are never visible to it).
* A view in error at `t` answers with its error messages, never with rows.
* The rows are the consolidated view at `t`, a row of multiplicity `n` appearing `n` times,
  filtered, projected and sorted by all projected columns (a total order on what is returned),
  so ``offset`` and ``limit`` pick the same rows every time.
* The driver holds at most about twice ``max_result_bytes`` (Arrow size): every Spark task encodes
  its rows as Arrow IPC chunks and stops, flagging it, once its own chunks pass the maximum; the
  driver fetches one partition at a time and stops once the running total passes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from mvsink.table import latest_version
from mvsink.target.read import NotReadable, view_contents, view_since, view_upper
from mvsink.updates import CLOSED, ERROR, RESERVED, is_error

#: Spark's LIMIT and OFFSET are 32-bit.
_MAX_ROWS = 2**31 - 1
#: The size of the Arrow chunks the tasks send to the driver (at most max_result_bytes).
_CHUNK_BYTES = 4 * 1024 * 1024
#: What the tasks send: an Arrow IPC stream, or (last) the flag that their rows passed the maximum.
_CHUNK_DDL = "ipc BINARY, exceeded BOOLEAN"
_CHUNK_SCHEMA = pa.schema([("ipc", pa.binary()), ("exceeded", pa.bool_())])
_RESERVED_PREFIX = "_mv_"


@dataclass(frozen=True)
class PeekRequest:
    view_id: str
    #: The view's Delta table path or URI.
    target: str
    time: int
    #: A Spark SQL boolean expression over the view's user columns.
    filter: str | None = None
    #: The projection (a tuple or list of user column names); None: all user columns.
    columns: tuple[str, ...] | None = None
    limit: int | None = None
    offset: int = 0
    max_result_bytes: int = 64 * 1024 * 1024


class PeekError(Exception):
    """The peek cannot be answered; the message says why (sent to the controller)."""


class PeekNotReady(PeekError):
    """The peek's time is not below the view's upper yet: retry once the upper has passed it."""


def run_peek(spark: SparkSession, request: PeekRequest) -> pa.Table:
    """The view's rows at ``request.time`` as an Arrow table of the projected columns."""
    _check_request(request)
    view, t = request.view_id, request.time
    upper = view_upper(request.target, view)
    version = latest_version(request.target)
    since = view_since(request.target, view)
    if not since <= t < upper:
        kind = PeekError if t < since else PeekNotReady
        raise kind(f"view {view!r} is readable at times [{since}, {upper}), not at time {t}")
    try:
        contents = view_contents(spark, request.target, view, t, version)
    except NotReadable as exc:
        raise PeekError(str(exc)) from None
    rows = _select(contents.where(F.col(ERROR).isNull()), request)
    _raise_if_in_error(contents, request)
    if request.offset:
        rows = rows.offset(request.offset)
    if request.limit is not None:
        rows = rows.limit(request.limit)
    return collect_arrow(rows, request.max_result_bytes,
                         f"the peek at view {view!r} at time {t}")


def _check_request(request: PeekRequest) -> None:
    def fail(field: str, must: str):
        raise PeekError(f"bad peek request: {field} must be {must}, not {getattr(request, field)!r}")

    for field in ("view_id", "target"):
        if not isinstance(getattr(request, field), str) or not getattr(request, field):
            fail(field, "a non-empty string")
    if not _is_int(request.time) or not 0 <= request.time < CLOSED:
        fail("time", f"an integer in [0, {CLOSED})")
    if request.filter is not None and (not isinstance(request.filter, str) or not request.filter.strip()):
        fail("filter", "None or a non-empty Spark SQL expression")
    columns = request.columns
    if columns is not None and (not isinstance(columns, (tuple, list)) or not columns
                                or not all(isinstance(c, str) for c in columns)):
        fail("columns", "None or a non-empty tuple of column names")
    if columns is not None and len(set(columns)) != len(columns):
        fail("columns", "free of duplicates")
    if request.limit is not None and (not _is_int(request.limit) or not 0 <= request.limit <= _MAX_ROWS):
        fail("limit", f"None or an integer in [0, {_MAX_ROWS}]")
    if not _is_int(request.offset) or not 0 <= request.offset <= _MAX_ROWS - (request.limit or 0):
        fail("offset", f"an integer >= 0 with offset + limit <= {_MAX_ROWS}")
    if not _is_int(request.max_result_bytes) or request.max_result_bytes <= 0:
        fail("max_result_bytes", "a positive integer")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _col(name: str) -> Column:
    """The column ``name`` taken literally (dots and backticks are part of the name)."""
    return F.col("`" + name.replace("`", "``") + "`")


def _select(ok: DataFrame, request: PeekRequest) -> DataFrame:
    """The ok rows filtered, projected and sorted; analysed by Spark, nothing run yet."""
    names = [c for c in ok.columns if c not in RESERVED]
    user = ok.select(*[_col(c) for c in names])
    columns = list(request.columns) if request.columns is not None else names
    for column in (c for c in columns if c not in names):
        if column.lower().startswith(_RESERVED_PREFIX):
            raise PeekError(f"column {column!r} in the projection is reserved for mvsink, "
                            f"not a column of view {request.view_id!r} (its columns: {', '.join(names)})")
        raise PeekError(f"unknown column {column!r} in the projection: view {request.view_id!r} "
                        f"has columns {', '.join(names)}")
    if request.filter is not None:
        user = _filtered(user, request, names)
    projected = [_col(c) for c in columns]
    return user.select(*projected).orderBy(*projected)


def _filtered(user: DataFrame, request: PeekRequest, names: list[str]) -> DataFrame:
    """``user`` filtered, the filter first analysed against an empty relation of the user columns:
    on ``user`` itself Spark would also resolve the ``_mv_*`` columns projected away below it."""
    text = request.filter
    try:
        probe = user.sparkSession.createDataFrame([], user.schema).where(F.expr(text))
        probe.schema  # noqa: B018 -- analyses the plan now (Spark Connect analyses lazily)
    except ParseException as exc:
        raise PeekError(f"filter {text!r} does not parse: {str(exc).strip()}") from None
    except AnalysisException as exc:
        condition = exc.getCondition() or ""
        first_line = str(exc).splitlines()[0]
        if condition.startswith("UNRESOLVED_COLUMN"):
            column = (exc.getMessageParameters() or {}).get("objectName", "?")
            parts = column.replace("`", "").split(".")
            if any(p.lower().startswith(_RESERVED_PREFIX) for p in parts):
                raise PeekError(f"filter {text!r} names column {column}, which is reserved for mvsink, "
                                f"not a column of view {request.view_id!r} (its columns: "
                                f"{', '.join(names)})") from None
            raise PeekError(f"filter {text!r} names unknown column {column}: view {request.view_id!r} "
                            f"has columns {', '.join(names)} ({first_line})") from None
        raise PeekError(f"filter {text!r} is not a boolean condition over the columns of view "
                        f"{request.view_id!r}: {first_line}") from None
    return user.where(F.expr(text))


def _raise_if_in_error(contents: DataFrame, request: PeekRequest) -> None:
    errors = contents.where(is_error()).select(ERROR).limit(5).collect()
    if errors:
        raise PeekError(f"view {request.view_id!r} is in error at time {request.time}: "
                        + " | ".join(r[0] for r in errors))


def collect_arrow(rows: DataFrame, max_bytes: int, what: str) -> pa.Table:
    """``rows`` as Arrow, fetched a partition at a time; a :class:`PeekError` naming ``what``
    once they pass ``max_bytes``."""
    chunks = rows.mapInArrow(_encoder(max_bytes, min(max_bytes, _CHUNK_BYTES)), _CHUNK_DDL)
    batches, total = [], 0
    stream = chunks.toLocalIterator()
    try:
        for chunk in stream:
            if not chunk.exceeded:
                for batch in pa.ipc.open_stream(chunk.ipc):
                    batches.append(batch)
                    total += batch.nbytes
            if chunk.exceeded or total > max_bytes:
                raise PeekError(f"the result of {what} exceeds max_result_bytes {max_bytes} (Arrow size); "
                                "ask for fewer rows (limit, filter) or columns")
    finally:
        stream.close()  # stops the fetching of further partitions
    # The tasks' Arrow types follow the session's settings (time zone, large string types);
    # the answer has Spark's default mapping, whether or not it has rows.
    schema = to_arrow_schema(rows.schema)
    return pa.Table.from_batches(batches).cast(schema) if batches else schema.empty_table()


def _encoder(max_bytes: int, chunk_bytes: int):
    """The function every task runs: its Arrow batches as IPC chunks of about ``chunk_bytes``,
    ending with an ``exceeded`` flag instead once they add up to more than ``max_bytes``."""

    def encode(batches):
        total = 0
        for batch in batches:
            rows_per_chunk = max(1, chunk_bytes * batch.num_rows // max(batch.nbytes, 1))
            for start in range(0, batch.num_rows, rows_per_chunk):
                piece = batch.slice(start, rows_per_chunk)
                total += piece.nbytes
                if total > max_bytes:
                    yield pa.RecordBatch.from_pydict({"ipc": [None], "exceeded": [True]}, schema=_CHUNK_SCHEMA)
                    return
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, piece.schema) as writer:
                    writer.write_batch(piece)
                yield pa.RecordBatch.from_pydict({"ipc": [sink.getvalue().to_pybytes()], "exceeded": [False]},
                                                 schema=_CHUNK_SCHEMA)

    return encode
