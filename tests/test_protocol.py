"""The replica protocol against a real replica process (``mvsink_job.py --listen``) over gRPC.

One replica serves the whole module (a JVM is slow to start); the tests run in order and each
starts from what the previous one left: a fresh replica, then one view, read-only, then writing.
"""

from __future__ import annotations

import json
import queue
import signal
import threading
import time
from collections import Counter
from types import SimpleNamespace

import grpc
import pytest
from deltalake import DeltaTable

from helpers import Replica, create_source, insert, log_history, view_upper_of, wait_for, write_config
from mvsink import ChangesInput, ViewDefinition
from mvsink.check import caught_up, check_table, expected_from_source
from mvsink.replica.controller import Controller, ControllerError, view_spec
from mvsink.replica.history import CommandHistory
from mvsink.replica.protocol import (AllowCompaction, CreateDataflow, CreateInstance,
                                     CreateTimely, Error, FrontierUpper, InitializationComplete, Peek,
                                     PeekResponse, Schedule, Status, decode_response, encode)
from mvsink.replica.server import STREAM_METHOD
from mvsink.table import latest_version
from mvsink.timeline import REASON_SOURCES, Timeline

VIEW = "orders"


class RawStream:
    """A bare protocol stream: send anything, collect every response."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.outbox: queue.Queue = queue.Queue()
        self.responses: list = []
        stream = self.channel.stream_stream(STREAM_METHOD)(iter(self.outbox.get, None), wait_for_ready=True)
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        try:
            for data in stream:
                self.responses.append(decode_response(data))
        except grpc.RpcError:
            pass

    def send(self, message) -> None:
        self.outbox.put(message if isinstance(message, bytes) else encode(message))

    def errors(self) -> list[Error]:
        return [r for r in self.responses if isinstance(r, Error)]

    def wait_errors(self, n: int, timeout: float = 60) -> list[Error]:
        wait_for(lambda: len(self.errors()) >= n, timeout, 0.1, f"{n} errors")
        return self.errors()

    def close(self) -> None:
        self.outbox.put(None)
        self.channel.close()


@pytest.fixture(scope="module")
def env(spark, tmp_path_factory):
    d = tmp_path_factory.mktemp("protocol")
    src, tgt = str(d / "src"), str(d / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b"), (3, "c")])
    config = write_config(d / "view.yaml", view_id=VIEW, target=tgt, key=["id"],
                          input={"kind": "changes", "source": src})
    replica = Replica(None, "p1", d, "--read-only", listen=True).start()
    yield SimpleNamespace(src=src, tgt=tgt, config=str(config), replica=replica, spark=spark, ctl=None)
    replica.kill(signal.SIGTERM)


def _timeline(env) -> str:
    return env.tgt + "_timeline"


def _expected_view(env):
    return expected_from_source(env.src, ["id", "v"], timeline=_timeline(env))


def _expected(env, t: int) -> Counter:
    return _expected_view(env)(t)


def _caught_up(env, ctl: Controller, timeout: float = 120) -> int:
    """Wait until the table has every time and the latest stands for the source's newest version,
    and the replica reports that frontier; returns it."""
    wait_for(lambda: caught_up(env.tgt, VIEW), timeout, what="the view to catch up", watch=(env.replica,))
    return ctl.wait_frontier(VIEW, view_upper_of(env.tgt, VIEW), timeout=timeout)


def _rows(table) -> Counter:
    return Counter(zip(table.column("id").to_pylist(), table.column("v").to_pylist()))


def assert_frontiers_advance(responses: list) -> None:
    """Per view: FrontierUpper only advances, never repeats, and the empty frontier comes last."""
    seen: dict[str, list] = {}
    for r in responses:
        if isinstance(r, FrontierUpper):
            seen.setdefault(r.view_id, []).append(r.upper)
    for view_id, uppers in seen.items():
        dropped = uppers[-1] is None
        values = uppers[:-1] if dropped else uppers
        assert None not in values, f"{view_id}: frontier reported after the drop: {uppers}"
        assert all(a < b for a, b in zip(values, values[1:])), f"{view_id}: {uppers}"


def test_stages_are_enforced_in_order(env):
    stream = RawStream(env.replica.address)
    stream.send(Peek("early", VIEW, 0))
    stream.send(CreateInstance())
    stream.send(InitializationComplete())
    errors = stream.wait_errors(3)
    assert [e.command for e in errors] == ["Peek", "CreateInstance", "InitializationComplete"]
    assert all("creation stage: expected CreateTimely" in e.message for e in errors)

    stream.send(CreateTimely())  # starts Spark: no response
    stream.send(CreateTimely())
    assert "expected CreateInstance" in stream.wait_errors(4)[-1].message
    stream.send(CreateInstance(3600.0))
    stream.send(AllowCompaction("nope", 3))  # collected during initialization, refused when applied
    stream.send(InitializationComplete())
    wait_for(lambda: any(isinstance(r, Status) for r in stream.responses), 120, 0.2, "a status")
    status = [r for r in stream.responses if isinstance(r, Status)][-1]
    assert status.stage == "read-only" and status.views == {}
    assert "no view 'nope'" in stream.wait_errors(5)[-1].message

    stream.send(InitializationComplete())
    stream.send(CreateTimely())
    stream.send(b'{"kind":"Launch"}')
    stream.send(Schedule("nope"))
    errors = stream.wait_errors(9)[5:]
    assert [e.command for e in errors] == ["InitializationComplete", "CreateTimely", "undecodable", "Schedule"]
    assert "initialization is already complete" in errors[0].message
    assert "after the creation stage" in errors[1].message
    assert "unknown message kind 'Launch'" in errors[2].message
    stream.close()

    # A controller whose instance configuration differs is refused; the replica is unharmed.
    other = RawStream(env.replica.address)
    other.send(CreateTimely())
    other.send(CreateInstance(5.0))
    assert "does not match" in other.wait_errors(1)[0].message
    other.close()
    with Controller(env.replica.address) as ctl:
        ctl.connect()
        assert ctl.status().stage == "read-only" and ctl.status().views == {}


def test_read_only_view_computes_then_writes_after_allow_writes(env):
    ctl = env.ctl = Controller(env.replica.address, timeout=180).connect()
    ctl.create_view(view_spec(env.config))
    status = ctl.wait_status(lambda s: VIEW in s.views and s.views[VIEW]["scheduled"], "scheduling")
    assert status.read_only and not status.views[VIEW]["hydrated"]
    time.sleep(3)
    # Read-only, it mints no time: with no timeline there is nothing to compute, nor to write.
    assert not ctl.status().views[VIEW]["hydrated"] and VIEW not in ctl.frontiers
    assert not DeltaTable.is_deltatable(env.tgt) and not DeltaTable.is_deltatable(_timeline(env))

    # Another writer on the timeline mints time 0; the read-only replica computes it.
    definition = ViewDefinition(VIEW, env.tgt, ChangesInput(env.src))
    latest = latest_version(env.src)
    assert Timeline(definition.timeline, definition.sources, "elsewhere").extend(
        {name: latest for name in definition.sources}, REASON_SOURCES, at=0)
    status = ctl.wait_status(lambda s: VIEW in s.views and s.views[VIEW]["hydrated"], "hydration")
    assert status.read_only and status.views[VIEW]["scheduled"]
    assert ctl.wait_frontier(VIEW, 0, timeout=60) == 0, "nothing in the table yet"
    time.sleep(2)
    assert not DeltaTable.is_deltatable(env.tgt), "a read-only replica writes nothing"
    assert DeltaTable(_timeline(env)).version() == 1, "a read-only replica mints no time"

    ctl.allow_writes()
    assert _caught_up(env, ctl) == 1, "time 0 was the source's newest version: no time to mint"
    assert DeltaTable(env.tgt).transaction_version(f"mvsink:{VIEW}") == 1
    insert(env.spark, env.src, [(4, "d")])
    assert _caught_up(env, ctl) == 2
    result = check_table(env.tgt, VIEW, ["id", "v"], _expected_view(env))
    assert result.ok, result.problems
    assert_frontiers_advance(ctl.responses)


def test_peek(env):
    ctl = env.ctl
    now = ctl.frontiers[VIEW] - 1
    assert _rows(ctl.peek(VIEW, now)) == _expected(env, now)
    picked = ctl.peek(VIEW, now, filter="id >= 2", columns=["v"], limit=2, offset=1)
    assert picked.column_names == ["v"] and picked.column("v").to_pylist() == ["c", "d"]

    with pytest.raises(ControllerError, match="exceeds"):
        ctl.peek(VIEW, now, max_result_bytes=10)
    with pytest.raises(ControllerError, match="no view 'missing'"):
        ctl.peek("missing", now)
    with pytest.raises(ControllerError, match="nope"):
        ctl.peek(VIEW, now, columns=["nope"])
    assert ctl.peek(VIEW, now).num_rows == 4, "the replica serves peeks after failed ones"

    # A peek at a time not final yet waits until it is.
    future = now + 1
    waiting = ctl.peek_async(VIEW, future, filter="id = 5")
    time.sleep(3)
    assert not [r for r in ctl.responses if isinstance(r, PeekResponse) and r.uuid == waiting]
    insert(env.spark, env.src, [(5, "e")])
    assert ctl.peek_response(waiting, timeout=120).table().column("v").to_pylist() == ["e"]

    # Cancel: a pending peek answers Canceled; cancelling it again, or an answered one, is ignored.
    pending = ctl.peek_async(VIEW, future + 100)
    ctl.cancel_peek(pending)
    assert ctl.peek_response(pending).status == "canceled"
    ctl.cancel_peek(pending)
    ctl.cancel_peek(waiting)
    ctl.peek(VIEW, now)  # a round trip after the cancels: they have been handled
    answers = Counter(r.uuid for r in ctl.responses if isinstance(r, PeekResponse))
    assert answers[pending] == 1 and answers[waiting] == 1


def test_update_configuration_without_restart(env):
    ctl = env.ctl
    before = ctl.status().views[VIEW]
    ctl.update_configuration(shuffle_partitions=3, trigger_seconds=0.3, log_level="DEBUG")
    status = ctl.status()
    assert status.config == {"shuffle_partitions": 3, "trigger_seconds": 0.3, "log_level": "DEBUG"}
    view = status.views[VIEW]
    assert view["loop_id"] != before["loop_id"], "the view steps at the new interval"
    assert view["hydrations"] == before["hydrations"] == 1, "no re-hydration"
    insert(env.spark, env.src, [(6, "f")])  # a step that mints, which logs at DEBUG
    wait_for(lambda: " DEBUG mvsink.mint" in env.replica.logs(), 60, what="debug logging")

    with pytest.raises(ControllerError, match="bad value 0 for shuffle_partitions"):
        ctl.update_configuration(shuffle_partitions=0)
    with pytest.raises(ControllerError, match="unknown setting 'colour'"):
        ctl.update_configuration(colour="blue", trigger_seconds=5)
    ctl.update_configuration(log_level="INFO")
    status = ctl.status()
    assert status.config["log_level"] == "INFO"
    assert status.config["shuffle_partitions"] == 3 and status.config["trigger_seconds"] == 0.3, \
        "a refused update changed nothing"


def test_allow_compaction_compacts_the_table(env):
    ctl = env.ctl
    for i in range(7, 9):
        insert(env.spark, env.src, [(i, f"v{i}")])
        upper = _caught_up(env, ctl)          # one time each
    since = upper - 2
    before = {t: _rows(ctl.peek(VIEW, t)) for t in range(since, upper)}
    ctl.compact(VIEW, since)

    def compaction():
        # Versions from the log files: the replica keeps committing while this reads. The one
        # asked for carries its since; the writer's own upkeep compacts small files without one.
        return [h for h in log_history(env.tgt) if h.get("mvsink.reason") == "compaction" and "mvsink.since" in h]
    commit = wait_for(compaction, 120, what="the compaction commit")[0]
    assert int(commit["mvsink.since"]) == since
    entry = (DeltaTable(env.tgt).table_uri.removeprefix("file://") + f"/_delta_log/{commit['version']:020d}.json")
    actions = [json.loads(line) for line in open(entry)]
    file_actions = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert file_actions and not any(a["dataChange"] for a in file_actions)
    for t, rows in before.items():
        assert _rows(ctl.peek(VIEW, t)) == rows, f"compaction changed the view at {t}"
    with pytest.raises(ControllerError, match="since"):
        ctl.peek(VIEW, since - 1)
    assert ctl.status().views[VIEW]["since"] == since


def test_reconnect_keeps_compatible_views_and_replaces_others(env):
    ctl = env.ctl
    running = ctl.status().views[VIEW]
    history = list(ctl.history)
    ctl.close()

    # A new controller that adopts the replica's history: nothing restarts, frontiers come afresh.
    with Controller(env.replica.address, timeout=120) as again:
        again.connect()
        assert [c for c in again.history if isinstance(c, CreateDataflow)] == \
            [c for c in history if isinstance(c, CreateDataflow)]
        status = again.status()
        kept = status.views[VIEW]
        assert kept["loop_id"] == running["loop_id"] and kept["hydrations"] == 1
        wait_for(lambda: again.frontiers.get(VIEW), 30, 0.1, "the frontier, reported afresh")
        insert(env.spark, env.src, [(9, "i")])
        _caught_up(env, again)
        assert_frontiers_advance(again.responses)
        assert again.status().views[VIEW]["loop_id"] == running["loop_id"]

    # A controller that wants the view with another definition: it is replaced.
    changed = [CreateDataflow({**c.view, "as_of": 1}) if isinstance(c, CreateDataflow) else c
               for c in history]
    with Controller(env.replica.address, history=CommandHistory(changed), timeout=120) as other:
        other.connect()
        replaced = other.status().views[VIEW]
        assert replaced["loop_id"] != running["loop_id"]
        assert "reconciliation: view orders is not requested as it runs" in env.replica.logs()
        _caught_up(env, other)
        result = check_table(env.tgt, VIEW, ["id", "v"], _expected_view(env))
        assert result.ok, result.problems
        # Drop: the empty frontier once, then nothing more for the view.
        other.drop(VIEW)
        assert other.frontiers[VIEW] is None and VIEW not in other.wait_status(
            lambda s: VIEW not in s.views, "the drop").views
        version, timeline_version = DeltaTable(env.tgt).version(), DeltaTable(_timeline(env)).version()
        insert(env.spark, env.src, [(10, "j")])
        time.sleep(4)
        assert DeltaTable(env.tgt).version() == version, "a dropped view's loop has stopped"
        assert DeltaTable(_timeline(env)).version() == timeline_version, "and mints no time"
        assert_frontiers_advance(other.responses)

    # A controller that does not ask for a view finds none running.
    with Controller(env.replica.address, history=CommandHistory([CreateTimely(), CreateInstance(3600.0)])) as bare:
        bare.connect()
        assert bare.status().views == {} and bare.status().stage == "read-write", "writability stays"
