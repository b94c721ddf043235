"""A replica's processes end together (issue 26): ``spark-submit mvsink_job.py --listen ...``
stopped the way an operator does it, ``kill $PID`` (SIGTERM) or ``kill -9`` (SIGKILL) to the
spark-submit process alone, leaves no process of the replica running and its protocol port free.
(The driver's last words cannot be checked: its output reaches the log through the spark-submit
JVM, gone by then.)"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from helpers import ROOT, Replica, kill_group, wait_for
from mvsink.spark import delta_jars


def _spark_submit() -> list[str]:
    script = Path(sys.executable).parent / "spark-submit"
    return [str(script) if script.exists() else "spark-submit", "--master", "local[1]",
            "--conf", "spark.ui.enabled=false", "--driver-memory", "512m", "--jars", ",".join(delta_jars())]


def _fields(stat_path: str) -> list[str]:
    """The fields of a ``/proc/.../stat`` after "pid (comm) ": state ppid pgrp ..."""
    stat = Path(stat_path).read_text()
    return stat[stat.rindex(")") + 2:].split()


def _members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command) of the live processes in process group ``pgid``.

    A process is live while any of its threads is: a leader thread shows as a zombie while the
    process's other threads are still exiting, and its open files (the protocol socket) are
    released only when the last thread has gone."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if int(_fields(f"/proc/{entry}/stat")[2]) != pgid:
                continue
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
            states = [_fields(f"/proc/{entry}/task/{task}/stat")[0] for task in os.listdir(f"/proc/{entry}/task")]
        except OSError:
            continue
        if any(state not in ("Z", "X") for state in states):
            members.append((int(entry), cmdline))
    return members


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, int(port))) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_stopping_spark_submit_ends_the_whole_replica(tmp_path, sig):
    env = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT / "src")}
    replica = Replica(None, "whole", tmp_path, listen=True, env=env, submit=_spark_submit()).start()
    pgid = replica.proc.pid  # spark-submit leads a session (and process group) of its own
    try:
        wait_for(lambda: _listening(replica.address), timeout=180, what="the replica to listen",
                 watch=(replica,))
        assert any("mvsink_job.py" in cmd and "java" not in cmd for _, cmd in _members(pgid)), _members(pgid)
        replica.signal(sig)  # spark-submit alone, as `kill $BLUE` does
        wait_for(lambda: replica.proc.poll() is not None and not _members(pgid), timeout=60,
                 what="every process of the replica to end")
        wait_for(lambda: not _listening(replica.address), timeout=10, what="the protocol port to be free")
        host, port = replica.address.rsplit(":", 1)
        with socket.socket() as sock:  # and can be listened on again at once
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, int(port)))
            sock.listen()
    finally:
        kill_group(pgid)
