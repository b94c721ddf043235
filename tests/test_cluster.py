"""Two replicas on a Spark standalone cluster (a master and two workers on this machine, each
worker 1 core and 1 GiB), each a ``spark-submit --master spark://...`` application with one
executor; source and target on S3 (moto). One replica is killed with SIGKILL mid-run and started
again while the source changes. The table equals the view at every committed version, and the
replicas' tasks (staging, the change feed's Python function) ran on the workers' executors.

The workers start without the AWS environment or mvsink's source path: what the executors know
of S3 and of mvsink reaches them through the application (``--jars``, ``spark.hadoop.*``,
``spark.executorEnv.*``), as on a real cluster.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.find_spark_home import _find_spark_home

from helpers import (ROOT, S3_BUCKET, Replica, free_port, kill_group, run_with_a_kill, s3_edit,
                     s3_server_fixture, wait_for, write_config)
from mvsink import storage
from mvsink.check import caught_up, check_table, expected_from_source
from mvsink.spark import delta_jars, s3a_jars
from mvsink.view import resolve_function

SPARK_HOME = Path(_find_spark_home())

SOURCE_VERSIONS = 10
WORKERS = 2
PYTHON_TASK_TIMES = re.compile(r"INFO \S+: Times: total = \d+, boot = ")

TRANSFORM = '''
def tag(row):
    """Keep ids not divisible by 5, mark v."""
    if row["id"] % 5 == 0:
        return None
    return {"id": row["id"], "v": row["v"] + "!"}
'''


@dataclass
class Cluster:
    url: str  # spark://127.0.0.1:PORT
    ui: str  # the master's web UI, http://127.0.0.1:PORT
    work: Path  # the workers' work directories: <work>/worker-<i>/<app id>/<executor id>/stderr

    def state(self) -> dict:
        with urllib.request.urlopen(self.ui + "/json", timeout=10) as response:
            return json.loads(response.read())


def _start(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and two workers (``spark-class`` processes, each in its own process
    group); every group is killed at the end, and the work directories (with each executor's
    copy of the jars) removed."""
    root = tmp_path_factory.mktemp("cluster")
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "PYTHONPATH"}
    env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", SPARK_DAEMON_MEMORY="256m",
               SPARK_LOCAL_DIRS=str(root / "local"))
    port, ui_port = free_port(), free_port()
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}", root / "work")
    procs = [_start([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(port), "--webui-port", str(ui_port)], root / "master.log", env)]
    try:
        wait_for(lambda: _answers(cluster, procs[0], root / "master.log"), timeout=120, what="the master")
        for i in range(WORKERS):
            procs.append(_start([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                 "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                                 "--work-dir", str(cluster.work / f"worker-{i}"), cluster.url],
                                root / f"worker-{i}.log", env))
        wait_for(lambda: sum(w["state"] == "ALIVE" for w in cluster.state()["workers"]) == WORKERS,
                 timeout=120, what=f"{WORKERS} workers")
        yield cluster
    finally:
        for proc in procs:
            kill_group(proc.pid)
            proc.wait()
        shutil.rmtree(root / "work", ignore_errors=True)
        shutil.rmtree(root / "local", ignore_errors=True)


def active_apps(cluster: Cluster, name: str) -> list[str]:
    """Ids of the running applications called ``name``."""
    return [a["id"] for a in cluster.state()["activeapps"] if a["name"] == name]


def python_tasks_ran(cluster: Cluster, app_id: str) -> bool:
    """Whether an executor of ``app_id`` finished a Python task: its log has a Python runner's
    times (``Times: total = ..., boot = ...``), logged by whichever Spark class ran the Python
    worker (``PythonRunner`` for RDD and UDF tasks, ``MapInBatchEvaluator...`` for ``mapInArrow``)."""
    return any(PYTHON_TASK_TIMES.search(log.read_text()) for log in cluster.work.glob(f"worker-*/{app_id}/*/stderr"))


def _answers(cluster: Cluster, master: subprocess.Popen, log: Path) -> bool:
    assert master.poll() is None, "the master exited:\n" + log.read_text()[-3000:]
    try:
        return cluster.state()["status"] == "ALIVE"
    except OSError:
        return False


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from s3_server_fixture(tmp_path_factory)


def spark_submit(cluster: Cluster) -> list[str]:
    """The command a replica runs under: the Delta and S3A jars shipped with ``--jars``, one core
    (two applications fit on two one-core workers), executors importing the mvsink under test."""
    return [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.url,
            "--jars", ",".join(delta_jars() + s3a_jars()), "--driver-memory", "1g",
            "--conf", "spark.cores.max=1", "--conf", "spark.executor.cores=1",
            "--conf", "spark.executor.memory=640m", "--conf", "spark.driver.host=127.0.0.1",
            "--conf", f"spark.executorEnv.PYTHONPATH={ROOT / 'src'}"]


#: The environment of a replica's spark-submit.
REPLICA_ENV = {"SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
               "PYTHONPATH": str(ROOT / "src"), "SPARK_LOCAL_IP": "127.0.0.1"}


def _view_config(tmp_path: Path, view_id: str, src: str, tgt: str) -> tuple[Path, Path]:
    """The config of a view of ``src``'s change feed through :data:`TRANSFORM`, and a log directory."""
    (tmp_path / "transform.py").write_text(TRANSFORM)
    config = write_config(tmp_path / "view.yaml", view_id=view_id, target=tgt, key=["id"],
                          input={"kind": "changes", "source": src, "map_row": "transform.py:tag",
                                 "output_schema": "id BIGINT, v STRING"})
    logs = tmp_path / "logs"
    logs.mkdir()
    return config, logs


def test_two_replicas_on_a_standalone_cluster_one_killed_and_restarted(cluster, s3, tmp_path):
    started = time.monotonic()
    rng = random.Random(10)
    src, tgt = f"s3://{S3_BUCKET}/cluster_orders", f"s3a://{S3_BUCKET}/cluster_view"
    write_deltalake(src, pa.table({"id": pa.array(range(10), pa.int64()), "v": [f"r0-{i}" for i in range(10)]}),
                    configuration={"delta.enableChangeDataFeed": "true"},
                    storage_options=storage.storage_options(src))
    config, logs = _view_config(tmp_path, "clusterview", src, tgt)
    fleet = [Replica(config, f"r{i}", logs, env=REPLICA_ENV, submit=spark_submit(cluster)).start() for i in range(2)]
    apps_running: dict[str, int] = {}

    def both_on_the_cluster() -> bool:
        apps_running.update({a["name"]: a["cores"] for a in cluster.state()["activeapps"]})
        return {"mvsink-r0", "mvsink-r1"} <= set(apps_running)

    wait_for(both_on_the_cluster, timeout=120, what="both replicas to register with the master", watch=tuple(fleet))
    # The kill comes early: the restart (a JVM, an executor, hydration) overlaps the edits.
    run = run_with_a_kill(fleet, src, tgt, "clusterview", rng, SOURCE_VERSIONS, kill_between=(1, 3),
                          restarted=lambda victim: any(python_tasks_ran(cluster, app) for app in
                                                       active_apps(cluster, f"mvsink-{victim.replica_id}")))
    wait_for(lambda: not cluster.state()["activeapps"], timeout=60, what="the applications to end")

    tag = resolve_function("transform.py:tag", tmp_path)
    result = check_table(tgt, "clusterview", ["id", "v"],
                         expected_from_source(src, ["id", "v"], tag, timeline=tgt + "_timeline"))
    apps = cluster.state()["completedapps"]
    print(f"cluster: 2 replicas, {run.victim.replica_id} killed with SIGKILL at source version {run.kill_at} "
          f"(upper {run.upper_at_kill}) and restarted; source versions {run.latest}; applications "
          f"{sorted((a['name'], a['cores'], a['state']) for a in apps)}; {time.monotonic() - started:.0f}s: "
          f"{result.summary()}")
    assert result.ok, result.problems[:5]
    assert run.victim.starts == 2
    assert result.versions_checked >= SOURCE_VERSIONS // 2, "the view was written step by step"
    assert run.upper_at_kill is not None and run.upper_at_kill < run.final_upper, "the kill came before the end"
    writers = {replica for _, _, reason, replica in result.commits if reason != "advance-upper"}
    assert writers == {"r0", "r1"}, f"only {writers} won commits that wrote updates"
    # Three applications (two replicas, one restart), each with one core on the cluster, all over.
    assert sorted(a["name"] for a in apps) == sorted(["mvsink-r0", "mvsink-r1", f"mvsink-{run.victim.replica_id}"])
    assert apps_running == {"mvsink-r0": 1, "mvsink-r1": 1}
    # Each replica ran Python tasks (the Python function, staging) on its executors, on a worker: a
    # standalone driver runs no tasks itself. (The victim's first application may be killed
    # before a Python task of its has ended: one application per replica is asked for.)
    for name in {a["name"] for a in apps}:
        ids = [a["id"] for a in apps if a["name"] == name]
        assert any(python_tasks_ran(cluster, i) for i in ids), f"{name} ({ids}) ran no Python task"


def _executors(app_id: str) -> list[int]:
    """Pids of the executor JVMs of application ``app_id`` on this machine."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmdline and app_id.encode() in cmdline:
                pids.append(int(entry))
    return pids


def test_an_executor_killed_under_a_running_replica(cluster, tmp_path):
    """Issue 26: the replica's one executor (holding its locally checkpointed state) is killed
    with SIGKILL while the source changes; the master gives the application a new one, the
    replica goes on by itself, and the table is exact at every version, no commit made twice."""
    started = time.monotonic()
    rng = random.Random(26)
    src, tgt, view_id = str(tmp_path / "orders"), str(tmp_path / "view"), "lostexec"
    write_deltalake(src, pa.table({"id": pa.array(range(10), pa.int64()), "v": [f"r0-{i}" for i in range(10)]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    config, logs = _view_config(tmp_path, view_id, src, tgt)
    replica = Replica(config, "x0", logs, env=REPLICA_ENV, submit=spark_submit(cluster)).start()
    next_id = [100]
    try:
        wait_for(lambda: caught_up(tgt, view_id), timeout=300, what="the first commits", watch=(replica,))
        (app,) = wait_for(lambda: active_apps(cluster, "mvsink-x0"), timeout=60, what="the application")
        (executor,) = wait_for(lambda: _executors(app), timeout=60, what="the executor")
        s3_edit(src, rng, 1, next_id)  # the next step reads it, likely while the executor dies
        os.kill(executor, signal.SIGKILL)
        killed_at = time.monotonic()
        for version in range(2, 8):
            s3_edit(src, rng, version, next_id)
            time.sleep(rng.uniform(0.3, 1.2))
        wait_for(lambda: caught_up(tgt, view_id), timeout=300, what="the view to catch up", watch=(replica,))
        recovered_in = time.monotonic() - killed_at
        new = wait_for(lambda: [p for p in _executors(app) if p != executor], timeout=60, what="a new executor")
        assert replica.alive()
    finally:
        replica.kill(signal.SIGTERM)
    tag = resolve_function("transform.py:tag", tmp_path)
    result = check_table(tgt, view_id, ["id", "v"], expected_from_source(src, ["id", "v"], tag, timeline=tgt + "_timeline"))
    assert result.ok, result.problems[:5]
    commit_ids = [h["mvsink.commit"] for h in DeltaTable(tgt).history() if h.get("mvsink.view") == view_id]
    assert len(commit_ids) == len(set(commit_ids)), "no commit made twice"
    log = replica.logs()
    how = [line[:240] for line in log.splitlines()
           if re.search(r"lost|recovered|hydration (started|done)|failed \(\d+ in a row\)", line, re.IGNORECASE)]
    assert re.search(r"lost executor|executor \d+ .*(removed|exited)", log, re.IGNORECASE), "the driver saw it go"
    print(f"executor {executor} of {app} killed; new executor {new}; caught up {recovered_in:.0f}s after the "
          f"kill; {time.monotonic() - started:.0f}s in all: {result.summary()}\n  " + "\n  ".join(how[-12:]))
