"""Fencing an older definition of a view (issue 26): once a replica of a changed definition has been
allowed to write and its first commit has landed, no replica of another definition commits to the
target again, whether it was running, paused or restarted across the cutover.

*blue* is ``SELECT id, amount FROM orders WHERE amount > 2``, *green* the same with ``> 4``."""

from __future__ import annotations

import signal
from collections import Counter
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from deltalake import DeltaTable

from helpers import Replica, create_source, insert, wait_for, write_config
from mvsink import MaterializedView, SnapshotInput, ViewDefinition, read_view
from mvsink.append.fence import DefinitionRefused, Fenced, fence_of
from mvsink.check import caught_up
from mvsink.metrics import render
from mvsink.replica.job import EXIT_FENCED

VIEW = "orders"
BLUE = "SELECT id, amount FROM orders WHERE amount > 2"
GREEN = "SELECT id, amount FROM orders WHERE amount > 4"
_next_id = [100]


def _orders(spark, tmp_path) -> str:
    src = str(tmp_path / "orders")
    create_source(spark, src, [(i, i) for i in range(1, 8)], schema="id BIGINT, amount BIGINT")
    return src


def _more_orders(spark, src: str, n: int = 2) -> None:
    rows = [(_next_id[0] + i, 1 + (_next_id[0] + i) % 9) for i in range(n)]
    _next_id[0] += n
    insert(spark, src, rows)


def _commits(target: str) -> list[dict]:
    """The view's commits, oldest first, each with its table version."""
    return [h for h in reversed(DeltaTable(target).history()) if h.get("mvsink.view") == VIEW]


def _assert_fenced_after_green(target: str) -> list[str]:
    """No commit by a blue replica after green's first; returns the writers in order."""
    writers = [c["mvsink.replica"] for c in _commits(target)]
    assert "green" in writers, writers
    after = writers[writers.index("green"):]
    assert not [w for w in after if w.startswith("blue")], f"blue wrote after green's first commit: {writers}"
    return writers


def _assert_is_green(spark, src: str, target: str) -> None:
    """The view's latest time is green's query over the source at that time's version."""
    from mvsink.check import TimelineReader

    upper = DeltaTable(target).transaction_version(f"mvsink:{VIEW}")
    version = TimelineReader(target + "_timeline").version(upper - 1)
    spark.read.format("delta").option("versionAsOf", version).load(src).createOrReplaceTempView("orders")
    want = Counter(tuple(r) for r in spark.sql(GREEN).collect())
    assert Counter(tuple(r) for r in read_view(spark, target, VIEW).collect()) == want


def test_python_api_blue_never_writes_after_greens_first_commit(spark, tmp_path):
    """The issue's reproduction, in one process: blue writes, green is promoted, blue never told."""
    src, tgt = _orders(spark, tmp_path), str(tmp_path / "tgt")

    def view(sql: str, replica: str, read_only: bool = False) -> MaterializedView:
        return MaterializedView(spark, ViewDefinition(VIEW, tgt, SnapshotInput(sql=sql), key=("id",),
                                                      sources={"orders": src}, replica_id=replica,
                                                      read_only=read_only))

    blue, green = view(BLUE, "blue"), view(GREEN, "green", read_only=True)
    assert blue.definition != green.definition
    blue.run_until_caught_up()
    assert fence_of(DeltaTable(tgt), VIEW) == blue.definition, "the table is created fenced for its creator"
    green.step()
    green.step()
    green.allow_writes()
    _more_orders(spark, src)
    fenced_at = None
    for round_ in range(6):
        try:
            blue.step()
        except Fenced:
            fenced_at = fenced_at if fenced_at is not None else round_
        green.step()
        _more_orders(spark, src)
    green.run_until_caught_up()
    assert fenced_at is not None and blue.fenced and "is fenced" in blue.fenced
    assert blue.read_only and green.definition in blue.fenced
    with pytest.raises(Fenced):
        blue.allow_writes()
    with pytest.raises(Fenced):
        blue.step()
    writers = _assert_fenced_after_green(tgt)
    assert fence_of(DeltaTable(tgt), VIEW) == green.definition
    reasons = [c["mvsink.reason"] for c in _commits(tgt) if c["mvsink.replica"] == "green"]
    assert reasons[0] == "fence", reasons
    assert all(c.get("mvsink.definition") == (blue.definition if c["mvsink.replica"] == "blue" else green.definition)
               for c in _commits(tgt)), "every commit records its definition"
    metrics = render({VIEW: blue})
    assert 'mvsink_fenced{view="orders",replica="blue"} 1' in metrics
    assert 'mvsink_fenced{view="orders",replica="green"} 0' in render({VIEW: green})
    _assert_is_green(spark, src, tgt)
    # A writer of blue started now (without read-only) refuses, naming both definitions; a
    # replica of green, started as a writer, writes together with the promoted one.
    with pytest.raises(DefinitionRefused) as refused:
        view(BLUE, "blue2")
    message = str(refused.value)
    assert blue.definition in message and green.definition in message and "--read-only" in message
    green2 = view(GREEN, "green2")
    _more_orders(spark, src)
    green2.run_until_caught_up()
    green.run_until_caught_up()
    assert _assert_fenced_after_green(tgt)[-1] in ("green", "green2")
    print(f"blue fenced in round {fenced_at}; writers {writers}")


@contextmanager
def _blue_then_green(spark, tmp_path, blue_env: dict | None = None):
    """Blue (a stand-alone writer, ``blue_env`` in its environment) caught up and green
    (read-only, allowed to write once the file ``allow`` exists) hydrated; both stopped after."""
    src, tgt = _orders(spark, tmp_path), str(tmp_path / "tgt")

    def config(name: str, sql: str):
        return write_config(tmp_path / f"{name}.yaml", view_id=VIEW, target=tgt, key=["id"],
                            sources={"orders": src}, input={"kind": "snapshot", "sql": sql})

    logs = tmp_path / "logs"
    logs.mkdir()
    allow = tmp_path / "allow"
    # Both start at once: green, read-only, computes nothing until blue has minted a time.
    blue = Replica(config("blue", BLUE), "blue", logs, env=blue_env).start()
    green = Replica(config("green", GREEN), "green", logs, "--read-only", "--allow-writes-file", str(allow)).start()
    try:
        wait_for(lambda: caught_up(tgt, VIEW), timeout=300, what="blue's first commits", watch=(blue, green))
        wait_for(lambda: "hydration done" in green.logs(), timeout=300, what="green hydrated", watch=(green,))
        yield SimpleNamespace(src=src, tgt=tgt, logs=logs, allow=allow, blue=blue, green=green)
        wait_for(lambda: caught_up(tgt, VIEW), timeout=120, what="green to write on", watch=(green,))
    finally:
        blue.kill(signal.SIGKILL)
        green.kill(signal.SIGTERM)
    _assert_fenced_after_green(tgt)
    _assert_is_green(spark, src, tgt)


def _wait_exit(replica: Replica, timeout: float) -> int:
    wait_for(lambda: not replica.alive(), timeout=timeout, what=f"{replica.replica_id} to exit")
    return replica.proc.returncode


def _green_committed(tgt: str) -> bool:
    return any(c["mvsink.replica"] == "green" for c in _commits(tgt))


def test_blue_with_a_commit_staged_across_the_cutover_then_restarted(spark, tmp_path):
    """A stand-alone blue still running when green's allow-writes file appears, with a commit
    staged (and its snapshot read) before green's first commit lands and made after it; then
    blue restarted by a supervisor, without --read-only."""
    arm, frozen, resume = (tmp_path / n for n in ("arm", "frozen", "resume"))
    failpoint = {"MVSINK_FAILPOINT": "before-commit", "MVSINK_FAILPOINT_ARMED_BY": str(arm),
                 "MVSINK_FAILPOINT_RESUME": str(resume), "MVSINK_FAILPOINT_MARKER": str(frozen)}
    with _blue_then_green(spark, tmp_path, failpoint) as run:
        arm.touch()
        _more_orders(spark, run.src)
        wait_for(frozen.exists, timeout=120, what="blue to stage a commit", watch=(run.blue,))
        run.allow.touch()
        wait_for(lambda: _green_committed(run.tgt), timeout=120, what="green's first commit", watch=(run.green,))
        resume.touch()
        assert _wait_exit(run.blue, 120) == EXIT_FENCED, run.blue.logs()[-3000:]
        assert "is fenced" in run.blue.logs()
        _more_orders(spark, run.src)
        wait_for(lambda: caught_up(run.tgt, VIEW), timeout=120, what="green to write on", watch=(run.green,))
        before = len(_commits(run.tgt))
        # A supervisor restarts blue as it was: it refuses at start, nothing written.
        run.blue.env = {}
        run.blue.start()
        assert _wait_exit(run.blue, 300) == EXIT_FENCED, run.blue.logs()[-3000:]
        restart_log = (run.logs / "blue-2.log").read_text()
        assert "started without --read-only writes only" in restart_log and "AllowWrites refused" in restart_log
        assert len(_commits(run.tgt)) == before
        _more_orders(spark, run.src)


def test_blue_paused_during_the_cutover_is_fenced_when_it_resumes(spark, tmp_path):
    """Blue SIGSTOPped while green is allowed to write and commits, SIGCONTed after."""
    with _blue_then_green(spark, tmp_path) as run:
        _more_orders(spark, run.src)
        run.blue.signal(signal.SIGSTOP)
        run.allow.touch()
        wait_for(lambda: _green_committed(run.tgt), timeout=120, what="green's first commit", watch=(run.green,))
        _more_orders(spark, run.src)
        wait_for(lambda: caught_up(run.tgt, VIEW), timeout=120, what="green to write on", watch=(run.green,))
        run.blue.signal(signal.SIGCONT)
        _more_orders(spark, run.src)
        assert _wait_exit(run.blue, 120) == EXIT_FENCED, run.blue.logs()[-3000:]
        assert "is fenced" in run.blue.logs()
