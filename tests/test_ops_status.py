"""Watching a stand-alone job from outside: its metrics show a (slow) hydration while it runs and
what it took afterwards; ``mvsink status --target`` / ``--config`` read the view's state (upper,
timeline, source lag, last commit with its repairs) from the table alone."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

from helpers import (ROOT, Replica, create_source, free_port, insert, log_history, view_upper_of, wait_for,
                     write_config)
from mvsink.check import caught_up
from mvsink.table import latest_version

VIEW = "watched"
ROWS = 200


def scrape(port: int) -> dict[str, float] | None:
    """metric name -> value (one view, one source); None while the endpoint is not up."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:
        return None
    return {m.group(1): float(m.group(2)) for line in text.splitlines()
            if (m := re.match(r"^(\w+)\{.*\} (\S+)$", line))}


def mvsink(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "mvsink.replica.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == expect, done.stdout + done.stderr
    return done


def test_hydration_progress_and_status_from_the_table(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src)
    for part in range(4):  # four files: the hydration has tasks to count
        insert(spark, src, [(i, f"v{i}") for i in range(part * ROWS // 4, (part + 1) * ROWS // 4)])
    (tmp_path / "slow.py").write_text(textwrap.dedent('''
        import time

        def slow(row):  # 50 ms a row: the hydration takes seconds
            time.sleep(0.05)
            return row
    '''))
    config = write_config(tmp_path / "view.yaml", view_id=VIEW, target=tgt, key=["id"],
                          input={"kind": "changes", "source": src, "map_row": "slow.py:slow",
                                 "output_schema": "id BIGINT, v STRING"})
    port = free_port()
    job = Replica(config, "solo", tmp_path, "--metrics-port", str(port)).start()
    try:
        during = []  # scrapes taken while the hydration ran
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            metrics = scrape(port)
            if metrics and metrics.get("mvsink_hydrating") == 1:
                during.append(metrics)
            elif metrics and metrics.get("mvsink_hydrations_total", 0) >= 1:
                break
            assert job.alive(), job.logs()[-3000:]
            time.sleep(0.2)
        assert during, "a scrape saw the hydration running"
        assert all(m["mvsink_hydration_started_seconds"] > time.time() - 900 for m in during)
        elapsed = [m["mvsink_hydration_elapsed_seconds"] for m in during]
        assert elapsed == sorted(elapsed) and elapsed[-1] > 0
        progress = [m["mvsink_hydration_progress"] for m in during]
        assert all(0 <= p <= 1 for p in progress) and max(progress) > 0, progress
        after = wait_for(lambda: (m := scrape(port)) and m["mvsink_steps_total"] >= 1 and m, timeout=120,
                         what="the hydrating step to end")
        assert after["mvsink_hydrating"] == 0 and after["mvsink_hydration_elapsed_seconds"] == 0
        assert after["mvsink_hydrations_total"] == 1 and after["mvsink_hydration_last_rows"] == ROWS
        assert after["mvsink_hydration_last_seconds"] >= 0.05 * ROWS / 2, "two cores at most"
        logs = job.logs()
        assert "hydration started at time 0" in logs and f"hydration done: {ROWS} updates to write in " in logs

        wait_for(lambda: caught_up(tgt, VIEW), timeout=300, what="the first commits", watch=(job,))
        foreign = latest_version(tgt) + 1  # the sources are idle: the job commits nothing before
        insert(spark, tgt, [(999, "garbage")])  # a foreign write: the job repairs it
        repair = wait_for(lambda: [h for h in log_history(tgt) if h.get("mvsink.reason") == "repair"],
                          timeout=180, what="the repair", watch=(job,))[0]
        wait_for(lambda: caught_up(tgt, VIEW), timeout=120, what="the repair's time", watch=(job,))
        status = json.loads(mvsink("status", "--target", tgt, "--json").stdout)
        assert status["view_id"] == VIEW and status["upper"] == view_upper_of(tgt, VIEW)
        assert status["timeline_upper"] == status["upper"] and status["since"] == 0
        last = status["last_commit"]
        assert (last["version"], last["replica"], last["reason"], last["repairs"]) == (
            repair["version"], "solo", "repair", [foreign]), last
        assert status["sources"]["src"]["lag_versions"] == 0

        job.kill(signal.SIGTERM)
        insert(spark, src, [(ROWS, "late")])  # no job mints a time for it: the view lags one version
        time.sleep(1)
        text = mvsink("status", "--config", str(config)).stdout
        assert f"view {VIEW} in {tgt}" in text and "lag 1 versions" in text, text
        lag = json.loads(mvsink("status", "--config", str(config), "--json").stdout)["sources"]["src"]
        assert lag["lag_versions"] == 1 and lag["lag_seconds"] >= 1 and lag["latest_version"] == 5, lag

        unknown = mvsink("status", "--target", tgt, "--view", "nope", expect=1)
        assert "holds no commit of view 'nope'" in unknown.stderr
        assert "no view has written" in mvsink("status", "--target", str(tmp_path / "none"), expect=1).stderr
    finally:
        job.kill(signal.SIGTERM)
