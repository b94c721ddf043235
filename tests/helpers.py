"""Test helpers: source tables, view configs, replica processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "mvsink_job.py"


def create_source(spark, path: str, rows: list[tuple] | None = None, schema: str = "id BIGINT, v STRING") -> None:
    """A Delta source table with the change data feed on and deletion vectors off."""
    spark.sql(
        f"CREATE TABLE delta.`{path}` ({schema}) USING delta TBLPROPERTIES "
        "(delta.enableChangeDataFeed = true, delta.enableDeletionVectors = false)"
    )
    if rows:
        insert(spark, path, rows)


def insert(spark, path: str, rows: list[tuple]) -> None:
    values = ", ".join("(" + ", ".join(_sql(v) for v in row) + ")" for row in rows)
    spark.sql(f"INSERT INTO delta.`{path}` VALUES {values}")


def _sql(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def write_config(path: Path, **settings) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


class Replica:
    """A replica as a separate process: ``python mvsink_job.py --config ...``."""

    def __init__(self, config: Path, replica_id: str, log_dir: Path, *extra: str, env: dict | None = None):
        self.config, self.replica_id, self.log_dir, self.extra = config, replica_id, log_dir, extra
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> "Replica":
        self.starts += 1
        log = open(self.log_dir / f"{self.replica_id}-{self.starts}.log", "w")
        env = {**os.environ, "MVSINK_LOG_LEVEL": "INFO", **self.env}
        self.proc = subprocess.Popen(
            [sys.executable, str(JOB), "--config", str(self.config), "--replica-id", self.replica_id,
             "--trigger-seconds", "0.5", *self.extra],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.log_dir.glob(f"{self.replica_id}-*.log")))


def wait_for(predicate, timeout: float, interval: float = 0.5, what: str = "condition",
             watch: tuple["Replica", ...] = ()):
    """Wait until ``predicate()`` is true; fail at once if a watched replica has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        for replica in watch:
            if not replica.alive():
                raise AssertionError(f"replica {replica.replica_id} exited while waiting for {what}:\n"
                                     + replica.logs()[-4000:])
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
