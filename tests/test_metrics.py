"""A stand-alone job's metrics endpoint (Prometheus text): two replica processes of one view show
their steps, a lost race, a repair of a foreign write, and the source lag; a port in use stops the
job before it writes."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.request

from helpers import JOB, ROOT, Replica, create_source, free_port, insert, view_upper_of, wait_for, write_config


def _scrape(port: int) -> dict[str, float]:
    """metric{labels} -> value, summed over labels per metric name and view."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = re.match(r"^(\w+)\{.*\} (\S+)$", line).groups()
            values[name] = values.get(name, 0.0) + float(value)
    return values


def test_metrics_show_steps_a_lost_race_a_repair_and_the_source_lag(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, f"v{i}") for i in range(5)])
    config = write_config(tmp_path / "view.yaml", view_id="watched", target=tgt, key=["id"],
                          input={"kind": "changes", "source": src})
    logs = tmp_path / "logs"
    logs.mkdir()
    ports = [free_port(), free_port()]
    fleet = [Replica(config, f"r{i}", logs, "--metrics-port", str(port)).start() for i, port in enumerate(ports)]
    try:
        wait_for(lambda: view_upper_of(tgt, "watched"), timeout=240, what="the first commit", watch=tuple(fleet))
        both = lambda name: sum(_scrape(port).get(name, 0) for port in ports)  # noqa: E731
        for n in range(12):  # the two replicas race for every time
            insert(spark, src, [(100 + n, f"n{n}")])
            wait_for(lambda: view_upper_of(tgt, "watched") >= n + 2, timeout=120, what=f"time {n + 1}",
                     watch=tuple(fleet))
            if both("mvsink_commits_lost_total") >= 1:
                break
        assert both("mvsink_commits_lost_total") >= 1, "one replica lost a race, and says so"
        # A step records its metrics when it ends, after its commit is in the table: the winner
        # of the last time may not have said so yet.
        wait_for(lambda: both("mvsink_commits_won_total") >= 2, timeout=60, what="two won commits in the metrics",
                 watch=tuple(fleet))
        repairs = both("mvsink_repairs_total")
        insert(spark, tgt, [(999, "garbage")])  # a foreign write
        wait_for(lambda: both("mvsink_repairs_total") > repairs, timeout=120, what="a repair in the metrics",
                 watch=tuple(fleet))
        wait_for(lambda: max(_scrape(p).get("mvsink_upper", 0) for p in ports) == view_upper_of(tgt, "watched"),
                 timeout=60, what="the upper in the metrics")
        # Steps are counted when they end; a replica's first steps (JVM warm-up, hydration) take
        # seconds, so the count is waited for, not read once.
        wait_for(lambda: _scrape(ports[0])["mvsink_steps_total"] >= 3, timeout=60, what="three steps of r0",
                 watch=tuple(fleet))
        for replica in fleet:
            replica.kill()
        insert(spark, src, [(500, "late")])  # a commit no time covers: a read-only replica mints none
        fleet[0] = Replica(config, "r0", logs, "--metrics-port", str(ports[0]), "--read-only").start()
        lagging = wait_for(lambda: (lambda m: m if m and m.get("mvsink_steps_total") else None)(
            _scrape_or_none(ports[0])), timeout=180, what="metrics of the read-only replica", watch=(fleet[0],))
        assert lagging["mvsink_source_lag_versions"] == 1 and lagging["mvsink_source_lag_seconds"] > 0, lagging
        assert lagging["mvsink_read_only"] == 1
    finally:
        for replica in fleet:
            replica.kill()


def _scrape_or_none(port: int) -> dict[str, float] | None:
    try:
        return _scrape(port)
    except OSError:
        return None


def test_a_metrics_port_in_use_stops_the_job_before_it_writes(tmp_path, spark):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    config = write_config(tmp_path / "view.yaml", view_id="v", target=tgt, input={"kind": "changes", "source": src})
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([sys.executable, str(JOB), "--config", str(config), "--metrics-port", str(port)],
                                cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"metrics port {port} cannot be used" in result.stderr
    assert not (tmp_path / "tgt").exists(), "nothing written"
