"""A user's first hour (issue 61): bad input is refused with a clear message and exit code 2
before Spark starts (a fake ``spark-submit`` that leaves a mark shows none was launched);
commands that met a missing table, a table no view wrote or a replica not up yet say so, exit 1,
no traceback; and a job running a two-view pipeline, as a person watches it: every line about a
step names its view, idle steps stay out of the INFO log, a source that gains a column is a
WARNING naming the view and the column, a source that drops a column a view reads stops that view
alone (ERROR naming it) while the other goes on writing, and Ctrl-C (SIGINT) stops the job
between steps with a log line naming the views and exit code 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import write_deltalake

from helpers import JOB, ROOT, Replica, view_upper_of, wait_for

MVSINK = [sys.executable, "-m", "mvsink.replica.cli"]


def _source(path: Path, ids: list[int]) -> str:
    write_deltalake(str(path), pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]}))
    return str(path)


@pytest.fixture
def no_spark(tmp_path) -> tuple[dict, Path]:
    """An environment whose Spark is a ``spark-submit`` that only leaves a mark (and fails): a
    process that starts Spark in it leaves the mark."""
    import pyspark

    home, mark = tmp_path / "spark-home", tmp_path / "spark-was-started"
    (home / "bin").mkdir(parents=True)
    (home / "jars").symlink_to(Path(pyspark.__file__).parent / "jars")  # what is read before the launch
    submit = home / "bin" / "spark-submit"
    submit.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    submit.chmod(0o755)
    return {**os.environ, "SPARK_HOME": str(home), "PYTHONPATH": str(ROOT / "src")}, mark


def _pipeline(folder: Path, files: dict[str, str], sources: dict[str, str], **yaml_extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pipeline.yaml").write_text(yaml.safe_dump({"sources": sources, "targets": str(folder / "views"),
                                                          **yaml_extra}))
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


GOOD_SQL = "CREATE MATERIALIZED VIEW va KEY (id) AS SELECT * FROM a"


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (the command's arguments, what its message must say)."""
    a = _source(tmp / "a", [1])
    view = {"view_id": "v", "target": str(tmp / "t"), "sources": {"a": a},
            "input": {"kind": "snapshot", "sql": "SELECT * FROM a"}}

    def config(name: str, **change) -> str:
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**view, **change}))
        return str(path)

    def pipeline(name: str, files: dict[str, str], sources: dict | None = None, **extra) -> str:
        return str(_pipeline(tmp / name, files, sources or {"a": a}, **extra))

    job = [sys.executable, str(JOB)]
    return {
        "a kind that does not exist": (
            [*job, "--config", config("kind", input={"kind": "snapshott", "sql": "SELECT 1"})],
            "input kind 'snapshott' is not one of the kinds: changes"),
        "a config file that does not exist": ([*job, "--config", str(tmp / "nope.yaml")], "does not exist"),
        "a source that is no table": ([*job, "--config", config("src", sources={"a": str(tmp / "nope")})],
                                      f"source a ({tmp / 'nope'}) is not a Delta table"),
        "a pipeline statement that is no view's": (
            [*job, "--pipeline", pipeline("header", {"a.sql": "CREATE VIEW va AS SELECT 1"})],
            "a.sql:1: expected MATERIALIZED, found 'VIEW'"),
        "a pipeline source that is no table": (
            [*job, "--pipeline", pipeline("src", {"a.sql": GOOD_SQL}, {"a": str(tmp / "nope")})],
            f"source a ({tmp / 'nope'}) is not a Delta table"),
        "a pipeline Python file that does not import": (
            [*job, "--pipeline", pipeline("py", {"a.sql": GOOD_SQL, "p.py": "import nope_no_such_module\n"})],
            "p.py:1: cannot import it: ModuleNotFoundError"),
        "a pipeline trigger of 0": (
            [*job, "--pipeline", pipeline("trigger", {"a.sql": GOOD_SQL}, defaults={"trigger_seconds": 0})],
            "defaults.trigger_seconds must be a positive number of seconds, not 0"),
        "--trigger-seconds 0": ([*job, "--config", config("ok"), "--trigger-seconds", "0"],
                                "--trigger-seconds: must be a positive number of seconds, not 0"),
        "--trigger-seconds -1": ([*job, "--config", config("ok"), "--trigger-seconds", "-1"],
                                 "--trigger-seconds: must be a positive number of seconds, not -1"),
        "explain of a missing file": ([*MVSINK, "explain", str(tmp / "nope.yaml")], "does not exist"),
        "explain of a bad pipeline": (
            [*MVSINK, "explain", "--pipeline", pipeline("explain", {"a.sql": "CREATE VIEW va AS SELECT 1"})],
            "a.sql:1: expected MATERIALIZED"),
    }


def test_bad_input_exits_2_with_its_message_before_spark_starts(tmp_path, no_spark):
    env, mark = no_spark
    for name, (command, message) in _bad_inputs(tmp_path).items():
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert done.returncode == 2, (name, done.returncode, done.stderr[-3000:])
        assert message in done.stderr, (name, done.stderr[-3000:])
        assert "Traceback" not in done.stderr, (name, done.stderr[-3000:])
        assert not mark.exists(), f"{name}: Spark was started before the input was refused"
        assert not (tmp_path / "t").exists() and not list(tmp_path.glob("*/views")), f"{name}: something was written"


def test_commands_on_missing_or_foreign_tables_or_a_replica_not_up_say_so(tmp_path):
    plain = tmp_path / "plain"
    write_deltalake(str(plain), pa.table({"a": [1]}))
    cases = {
        "version of a missing table": (["version", str(tmp_path / "nope"), "--time", "1"],
                                       f"{tmp_path / 'nope'} is not a Delta table"),
        "sql of a table no view wrote": (["sql", str(plain)], f"{plain} has no mvsink commit: no view wrote this table"),
        "a replica not up (yet)": (["--timeout", "1", "--replica", "127.0.0.1:1", "status"],
                                   "replica 127.0.0.1:1 is not reachable (DEADLINE_EXCEEDED after 1s): it is not "
                                   "running, or still starting"),
    }
    for name, (args, message) in cases.items():
        done = subprocess.run([*MVSINK, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 1, (name, done.returncode, done.stdout, done.stderr[-3000:])
        assert message in done.stderr and "Traceback" not in done.stderr, (name, done.stderr[-3000:])
        assert not done.stdout, (name, done.stdout)


#: Loggers whose lines are about one view's step (or its creation).
_STEP_LOGGERS = re.compile(r" (INFO|WARNING|ERROR|DEBUG) (mvsink\.(sink|append|write|desired|correction|timeline|"
                           r"step_loop|target|mint)\S*) \[\d+\] (.*)$")


def test_a_two_view_pipeline_as_a_person_watches_it(tmp_path):
    a, b = _source(tmp_path / "a", [1, 2]), _source(tmp_path / "b", [1])
    folder = _pipeline(tmp_path / "shop", {"views.sql": "CREATE MATERIALIZED VIEW va KEY (id) AS SELECT * FROM a;\n"
                                                        "CREATE MATERIALIZED VIEW vb KEY (id) AS SELECT id, v FROM b"},
                       {"a": a, "b": b})
    targets = {v: str(folder / "views" / v) for v in ("va", "vb")}
    job = Replica(None, "watched", tmp_path, "--pipeline", str(folder)).start()
    try:
        wait_for(lambda: all((view_upper_of(t, v) or 0) >= 1 for v, t in targets.items()), timeout=600,
                 what="both views to write", watch=(job,))
        # a gains a column: va (SELECT *) keeps its columns, and says so
        write_deltalake(a, pa.table({"id": pa.array([3], pa.int64()), "v": ["v3"], "w": ["new"]}),
                        mode="append", schema_mode="merge")
        wait_for(lambda: "source a has new column(s) w" in job.logs(), timeout=300,
                 what="the new column's warning", watch=(job,))
        # b drops v, which vb reads: vb stops, va goes on
        write_deltalake(b, pa.table({"id": pa.array([1], pa.int64())}), mode="overwrite", schema_mode="overwrite")
        wait_for(lambda: "view vb failed and stopped" in job.logs(), timeout=300, what="vb to fail", watch=(job,))
        before = view_upper_of(targets["va"], "va")
        write_deltalake(a, pa.table({"id": pa.array([4], pa.int64()), "v": ["v4"], "w": ["x"]}), mode="append")
        wait_for(lambda: view_upper_of(targets["va"], "va") > before, timeout=300,
                 what="va to write on after vb failed", watch=(job,))
        job.signal(signal.SIGINT)
        code = job.proc.wait(timeout=300)
        assert code == 0, (code, job.logs()[-3000:])
    finally:
        job.kill()
    log = job.logs()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-5000:]
    assert re.search(r"stopping on SIGINT: views va, vb stop between steps", log), log[-3000:]
    assert re.search(r" WARNING mvsink\.\S+ \[\d+\] view va: source a has new column\(s\) w \(version \d+\); the view "
                     r"keeps its columns id, v", log), log[-5000:]
    assert re.search(r" ERROR mvsink\.replica \[\d+\] view vb failed and stopped: .*`v` cannot be resolved.*; "
                     r"views va go on", log), log[-5000:]
    step_lines = [m for m in map(_STEP_LOGGERS.search, log.splitlines()) if m]
    assert len(step_lines) > 10, log[-3000:]
    unnamed = [m.group(0) for m in step_lines if not re.match(r"view '?(va|vb)'?[: (]", m.group(4))]
    assert not unnamed, unnamed[:10]
    for view in ("va", "vb"):  # grep follows one view's life: created, allowed to write, its batches
        own = [m.group(4) for m in step_lines if re.match(rf"view '?{view}'?[: (]", m.group(4))]
        assert any("writes allowed" in line for line in own), own[:10]
        assert any(re.search(r"batch \d+: table v\d+ upper \d+", line) for line in own), own[:20]
        assert not any(re.search(r"\(table layout\).*read-only", line) for line in own), own[:10]
    idle = [m.group(0) for m in step_lines if m.group(1) == "INFO" and "batch none no append" in m.group(4)
            and "0 corrections" in m.group(4) and "minted" not in m.group(4)]
    assert not idle, idle[:5]
