"""The protocol's wire encoding (pinned byte for byte) and the command history's reduction."""

from __future__ import annotations

import pyarrow as pa
import pytest

from mvsink.replica.history import CommandHistory
from mvsink.replica.protocol import (COMMANDS, RESPONSES, AllowCompaction, AllowWrites, CancelPeek,
                                     CreateDataflow, CreateInstance, CreateTimely, Error, FrontierUpper,
                                     InitializationComplete, Peek, PeekResponse, Plan, PlanResponse,
                                     ProtocolError, Schedule,
                                     Status, UpdateConfiguration, decode, decode_command,
                                     decode_response, encode)

#: One example of every message and its encoding. Changing any of these breaks compatibility
#: with running replicas and controllers: that needs a new protocol version.
GOLDEN = [
    (CreateTimely(), b'{"kind":"CreateTimely","protocol_version":1}'),
    (CreateInstance(60.0), b'{"kind":"CreateInstance","orphan_grace_seconds":60.0}'),
    (CreateDataflow({"view_id": "v", "target": "/t", "input": {"kind": "changes", "source": "/s"}}),
     b'{"kind":"CreateDataflow","view":{"input":{"kind":"changes","source":"/s"},"target":"/t","view_id":"v"}}'),
    (Schedule("v"), b'{"kind":"Schedule","view_id":"v"}'),
    (InitializationComplete(), b'{"kind":"InitializationComplete"}'),
    (AllowWrites(), b'{"kind":"AllowWrites"}'),
    (AllowCompaction("v", 7), b'{"frontier":7,"kind":"AllowCompaction","view_id":"v"}'),
    (AllowCompaction("v", None), b'{"frontier":null,"kind":"AllowCompaction","view_id":"v"}'),
    (Peek("p1", "v", 3, "x > 1", ["x"], 10, 2, 1000),
     b'{"columns":["x"],"filter":"x > 1","kind":"Peek","limit":10,"max_result_bytes":1000,'
     b'"offset":2,"time":3,"uuid":"p1","view_id":"v"}'),
    (CancelPeek("p1"), b'{"kind":"CancelPeek","uuid":"p1"}'),
    (Plan("q1", "v", 10, 1000), b'{"kind":"Plan","limit":10,"max_result_bytes":1000,"uuid":"q1","view_id":"v"}'),
    (UpdateConfiguration({"trigger_seconds": 0.5}),
     b'{"kind":"UpdateConfiguration","params":{"trigger_seconds":0.5}}'),
    (FrontierUpper("v", 12), b'{"kind":"FrontierUpper","upper":12,"view_id":"v"}'),
    (FrontierUpper("v", None), b'{"kind":"FrontierUpper","upper":null,"view_id":"v"}'),
    (PeekResponse("p1", "canceled"), b'{"arrow":null,"error":null,"kind":"PeekResponse","status":"canceled","uuid":"p1"}'),
    (PlanResponse("q1", "error", error="no view"),
     b'{"added":null,"arrow":null,"error":"no view","kind":"PlanResponse","lower":null,"removed":null,'
     b'"status":"error","updates":null,"upper":null,"uuid":"q1"}'),
    (Status("r", "read-only", True, {"log_level": "INFO"}, {"v": {"frontier": 3}}),
     b'{"config":{"log_level":"INFO"},"kind":"Status","read_only":true,"replica_id":"r",'
     b'"stage":"read-only","views":{"v":{"frontier":3}}}'),
    (Error("Peek", "no"), b'{"command":"Peek","kind":"Error","message":"no"}'),
]


def test_every_message_kind_has_a_pinned_encoding():
    assert {type(m) for m, _ in GOLDEN} == set(COMMANDS + RESPONSES)


@pytest.mark.parametrize("message,wire", GOLDEN, ids=[type(m).__name__ for m, _ in GOLDEN])
def test_encoding_is_stable_and_round_trips(message, wire):
    assert encode(message) == wire
    assert decode(wire) == message
    assert encode(decode(wire)) == wire


def test_peek_rows_carry_arrow_tables():
    table = pa.table({"id": [1, 2, 2], "name": ["a", None, "b"]})
    response = decode_response(encode(PeekResponse.rows("p", table)))
    assert response.table().equals(table)


@pytest.mark.parametrize("wire,message", [
    (b"not json", "not JSON"),
    (b"[1]", "JSON object"),
    (b'{"kind":"Launch"}', "unknown message kind 'Launch'"),
    (b'{"kind":"Schedule"}', "missing fields ['view_id']"),
    (b'{"kind":"Schedule","view_id":"v","x":1}', "unknown fields ['x']"),
    (b'{"kind":"AllowCompaction","view_id":"v","frontier":"7"}', "AllowCompaction.frontier"),
    (b'{"kind":"Peek","uuid":"p","view_id":"v","time":true,"filter":null,"columns":null,"limit":null,'
     b'"offset":0,"max_result_bytes":1}', "Peek.time"),
])
def test_decoding_is_strict(wire, message):
    with pytest.raises(ProtocolError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode(wire)


def test_commands_and_responses_do_not_mix():
    with pytest.raises(ProtocolError, match="unknown message kind 'FrontierUpper'"):
        decode_command(encode(FrontierUpper("v", 1)))
    with pytest.raises(ProtocolError, match="unknown message kind 'Peek'"):
        decode_response(encode(Peek("p", "v", 1)))


def _dataflow(view_id: str, **extra) -> CreateDataflow:
    return CreateDataflow({"view_id": view_id, "target": f"/t/{view_id}", **extra})


def test_history_reduction():
    history = CommandHistory([
        CreateTimely(), CreateInstance(),
        _dataflow("a"), Schedule("a"),
        _dataflow("b"), Schedule("b"),
        Peek("p1", "a", 1), CancelPeek("p1"),
        AllowCompaction("a", 3), AllowCompaction("a", 5), AllowCompaction("a", 4),
        UpdateConfiguration({"trigger_seconds": 1}), UpdateConfiguration({"log_level": "DEBUG"}),
        AllowCompaction("b", 2), AllowCompaction("b", None),  # b dropped: all of it goes
        InitializationComplete(),
        AllowWrites(), AllowWrites(),
        UpdateConfiguration({"trigger_seconds": 2}),
        _dataflow("c"),
    ])
    history.reduce()
    assert list(history) == [
        CreateTimely(), CreateInstance(),
        _dataflow("a"), Schedule("a"), AllowCompaction("a", 5),
        _dataflow("c"),
        UpdateConfiguration({"trigger_seconds": 2, "log_level": "DEBUG"}),
        AllowWrites(),
    ]
    reduced = list(history)
    history.reduce()
    assert list(history) == reduced  # reducing is idempotent


def test_history_keeps_a_recreated_view_once_with_its_latest_definition():
    history = CommandHistory([CreateTimely(), CreateInstance(), _dataflow("a", as_of=1), Schedule("a"),
                              AllowCompaction("a", None), _dataflow("a", as_of=2)])
    history.reduce()
    assert list(history) == [CreateTimely(), CreateInstance(), _dataflow("a", as_of=2)]
