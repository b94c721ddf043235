"""The replica protocol's messages and their wire encoding.

A controller sends *commands* to a replica and the replica answers with *responses*, both in order
over one bidirectional gRPC stream per controller connection (:mod:`mvsink.replica.server`).

Wire encoding (stable, version 1): every message is one UTF-8 JSON object with the message name
under ``"kind"`` and its fields under their names, keys sorted, no insignificant whitespace.
Optional fields are always present (``null`` when unset), so a message has exactly one encoding:
``encode(decode(b)) == b`` for every valid ``b``. Decoding is strict: an unknown kind, a missing
or unknown field, or a field of the wrong type is a :class:`ProtocolError` naming it. Binary data
(peek results, Arrow IPC stream format) is base64 text. Adding a message kind is compatible;
changing a field is not and needs a new :data:`PROTOCOL_VERSION`.

Stages (checked by :mod:`mvsink.replica.state`): creation (``CreateTimely`` then
``CreateInstance``), initialization (computation commands, then ``InitializationComplete``),
computation read-only, computation read-write (after ``AllowWrites``; there is no way back).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import types
import typing
from dataclasses import dataclass, field

import pyarrow as pa

PROTOCOL_VERSION = 1


class ProtocolError(ValueError):
    """A message that cannot be decoded, or a command the replica cannot take in its stage."""


# -- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateTimely:
    """Creation, first: the replica's Spark session (started with the process) is taken into service."""

    protocol_version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class CreateInstance:
    """Creation, second: set up the replica's state. Must match on every reconnect."""

    #: Staged files unreferenced for longer than this are deleted (crash leftovers).
    orphan_grace_seconds: float = 3600.0


@dataclass(frozen=True)
class CreateDataflow:
    """Create a view from its specification (see :func:`mvsink.view.view_from_spec`); not started."""

    view: dict


@dataclass(frozen=True)
class Schedule:
    """Start a created view's query."""

    view_id: str


@dataclass(frozen=True)
class InitializationComplete:
    """Ends initialization: the replica reconciles what runs with the commands received."""


@dataclass(frozen=True)
class AllowWrites:
    """Leave read-only computation for good."""


@dataclass(frozen=True)
class AllowCompaction:
    """Advance a view's since to ``frontier`` (and compact its table); ``None`` drops the view."""

    view_id: str
    frontier: int | None


@dataclass(frozen=True)
class Peek:
    """Read a view's consolidated contents at ``time``; answered by exactly one PeekResponse."""

    uuid: str
    view_id: str
    time: int
    filter: str | None = None
    columns: list | None = None
    limit: int | None = None
    offset: int = 0
    max_result_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class CancelPeek:
    """Cancel a pending peek (answered Canceled); ignored for a peek already answered."""

    uuid: str


@dataclass(frozen=True)
class Plan:
    """Ask what the view's next commit at this replica would write if it were allowed to write
    now (a read-only replica's first commit after ``AllowWrites``); answered by exactly one
    PlanResponse carrying at most ``limit`` of its updates (None: all)."""

    uuid: str
    view_id: str
    limit: int | None = None
    max_result_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class UpdateConfiguration:
    """Change runtime settings: ``trigger_seconds``, ``shuffle_partitions``, ``log_level`` (mvsink's loggers)."""

    params: dict


# -- responses -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrontierUpper:
    """A view's write frontier advanced to ``upper``; ``None`` (empty): the view was dropped."""

    view_id: str
    upper: int | None


PEEK_ROWS, PEEK_ERROR, PEEK_CANCELED = "rows", "error", "canceled"


@dataclass(frozen=True)
class PeekResponse:
    uuid: str
    status: str
    #: The rows as an Arrow IPC stream, base64 (status "rows").
    arrow: str | None = None
    error: str | None = None

    def table(self) -> pa.Table:
        if self.status != PEEK_ROWS:
            raise ValueError(f"peek {self.uuid} has no rows: {self.status} {self.error or ''}")
        return pa.ipc.open_stream(base64.b64decode(self.arrow)).read_all()

    @staticmethod
    def rows(uuid: str, table: pa.Table) -> "PeekResponse":
        return PeekResponse(uuid, PEEK_ROWS, arrow=arrow_text(table))


@dataclass(frozen=True)
class PlanResponse:
    """The plan: the commit's description ``[lower, upper)``, its counts of updates, of rows
    added (the sum of the positive diffs) and removed (of the negative ones), and its updates
    (status "rows": view columns, ``_mv_error``, ``_mv_time``, ``_mv_diff``, at most the limit
    asked for, as an Arrow IPC stream, base64); or why there is none (status "error")."""

    uuid: str
    status: str
    lower: int | None = None
    upper: int | None = None
    updates: int | None = None
    added: int | None = None
    removed: int | None = None
    arrow: str | None = None
    error: str | None = None

    def table(self) -> pa.Table:
        if self.status != PEEK_ROWS:
            raise ValueError(f"plan {self.uuid} has no rows: {self.status} {self.error or ''}")
        return pa.ipc.open_stream(base64.b64decode(self.arrow)).read_all()


@dataclass(frozen=True)
class Status:
    """The replica's state: stage, read-only, settings, and per view its frontiers and hydration."""

    replica_id: str
    stage: str
    read_only: bool
    config: dict
    views: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Error:
    """A command was refused (out of order, unknown view, bad argument); nothing was changed."""

    command: str
    message: str


def arrow_text(table: pa.Table) -> str:
    """``table`` as an Arrow IPC stream, base64."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return base64.b64encode(sink.getvalue()).decode()


COMMANDS = (CreateTimely, CreateInstance, CreateDataflow, Schedule, InitializationComplete,
            AllowWrites, AllowCompaction, Peek, CancelPeek, Plan, UpdateConfiguration)
RESPONSES = (FrontierUpper, PeekResponse, PlanResponse, Status, Error)
Command = typing.Union[COMMANDS]
Response = typing.Union[RESPONSES]

_KINDS = {cls.__name__: cls for cls in COMMANDS + RESPONSES}


def encode(message) -> bytes:
    """The message's one wire encoding."""
    if type(message).__name__ not in _KINDS:
        raise ProtocolError(f"not a protocol message: {message!r}")
    body = {"kind": type(message).__name__, **dataclasses.asdict(message)}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def decode(data: bytes, allowed: tuple = COMMANDS + RESPONSES):
    """The message encoded in ``data``; ``allowed`` restricts the kinds accepted."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"message is not JSON: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
        raise ProtocolError("message must be a JSON object with a string 'kind'")
    kind = body.pop("kind")
    cls = _KINDS.get(kind)
    if cls is None or cls not in allowed:
        expected = sorted(c.__name__ for c in allowed)
        raise ProtocolError(f"unknown message kind {kind!r}; expected one of {expected}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    if set(body) != names:
        missing, unknown = sorted(names - set(body)), sorted(set(body) - names)
        raise ProtocolError(f"{kind}: missing fields {missing}, unknown fields {unknown}")
    for name, value in body.items():
        if not _has_type(value, hints[name]):
            raise ProtocolError(f"{kind}.{name}: {value!r} is not of type {hints[name]}")
    return cls(**body)


def decode_command(data: bytes):
    return decode(data, COMMANDS)


def decode_response(data: bytes):
    return decode(data, RESPONSES)


def _has_type(value, hint) -> bool:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_has_type(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)
