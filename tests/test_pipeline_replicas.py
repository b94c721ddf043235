"""A pipeline run as replica processes (``mvsink_job.py --pipeline DIR``): two replicas of six views
on one timeline, one killed with SIGKILL while the sources change, then a read-only
replica of a changed pipeline promoted (its changed views fence the old replicas, which exit 3):
every view at every committed version and time equal to DuckDB over the sources at that time's
versions (the old SQL before a changed view's switch, the new from it), and views read at one time
agree; a bad pipeline stops the job at start (exit 2, the file and line logged, nothing written)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys

import pyarrow as pa
from deltalake import write_deltalake

from helpers import JOB, ROOT, Replica, log_history, stop_all, wait_for
from mvsink.check import caught_up, check_table
from mvsink.pipeline import read_config
from pipeline_tpch import GOLD, SILVER, VIEWS, Independent, random_commit, views_agree, write_pipeline

#: The new pipeline's one change; it reaches the two views over it as well.
CHANGED = {"customer_nation", "customer_revenue", "nation_revenue"}


def _all_caught_up(targets: dict[str, str], timeline: str) -> bool:
    return all(caught_up(targets[view], view, timeline) for view in VIEWS)


def _writers(targets: dict[str, str]) -> set[str]:
    """The replicas that committed to some view's table."""
    return {h["mvsink.replica"] for view in VIEWS for h in log_history(targets[view]) if h.get("mvsink.view") == view}


def test_two_replicas_a_kill_and_a_promoted_changed_pipeline(spark, tmp_path):
    rng = random.Random(2727)
    blue_dir, green_dir, logs = tmp_path / "blue", tmp_path / "green", tmp_path / "logs"
    logs.mkdir()
    sources = write_pipeline(spark, blue_dir)
    config = read_config(blue_dir)
    targets, timeline = config.targets, config.timeline
    (green_dir / "sql").mkdir(parents=True)
    (green_dir / "sql" / "silver.sql").write_text(SILVER.replace(
        "ON c.c_nationkey = n.n_nationkey", "ON c.c_nationkey = n.n_nationkey WHERE n.n_name <> 'DE'"))
    (green_dir / "sql" / "gold.sql").write_text(GOLD)
    (green_dir / "pipeline.yaml").write_text((blue_dir / "pipeline.yaml").read_text().replace(
        "data/", f"{blue_dir}/data/").replace("targets: views", f"targets: {blue_dir}/views")
        .replace("timeline: views/", f"timeline: {blue_dir}/views/"))
    assert read_config(green_dir).targets == targets

    blue = [Replica(None, f"blue{i}", logs, "--pipeline", str(blue_dir)).start() for i in range(2)]
    allow = tmp_path / "allow-green"
    green = Replica(None, "green", logs, "--pipeline", str(green_dir), "--read-only",
                    "--allow-writes-file", str(allow))
    next_key = [100]
    try:
        wait_for(lambda: _all_caught_up(targets, timeline), timeout=400, what="every view's first commit",
                 watch=tuple(blue))
        made = 0  # the commits so far: each gets its own number (new keys are derived from it)
        for made in range(2):
            random_commit(spark, sources, rng, made, next_key)
        # blue0 is killed once it has won a commit, and blue1 carries on alone. Where blue1 has won
        # every race so far, it is paused (SIGSTOP) for one more commit, which blue0 then wins.
        if "blue0" not in _writers(targets):
            blue[1].signal(signal.SIGSTOP)
            made += 1
            random_commit(spark, sources, rng, made, next_key)
            wait_for(lambda: "blue0" in _writers(targets), timeout=300, what="blue0, blue1 paused, to win a commit",
                     watch=(blue[0],))
            blue[1].signal(signal.SIGCONT)
        blue[0].kill(signal.SIGKILL)
        green.start()  # read-only: it starts and hydrates while blue1 carries on alone
        for made in range(made + 1, made + 5):
            random_commit(spark, sources, rng, made, next_key)
        wait_for(lambda: _all_caught_up(targets, timeline), timeout=400, what="blue1 to catch up",
                 watch=(blue[1], green))
        wait_for(lambda: green.logs().count("hydration done") >= len(VIEWS), timeout=400,
                 what="green to hydrate every view", watch=(green,))
        made += 1
        random_commit(spark, sources, rng, made, next_key)
        allow.touch()
        wait_for(lambda: not blue[1].alive(), timeout=300, what="blue1 to be fenced")
        assert blue[1].proc.returncode == 3, blue[1].logs()[-3000:]
        for made in range(made + 1, made + 3):
            random_commit(spark, sources, rng, made, next_key)
        wait_for(lambda: _all_caught_up(targets, timeline), timeout=400, what="green to catch up", watch=(green,))
    finally:
        stop_all([*blue, green])

    old, new = Independent(blue_dir, sources, timeline), Independent(green_dir, sources, timeline)
    uppers, blue_writers = [], set()
    for view in VIEWS:
        history = [h for h in reversed(log_history(targets[view])) if h.get("mvsink.view") == view]
        writers = [h["mvsink.replica"] for h in history]
        assert "green" in writers, (view, set(writers))
        blue_writers |= set(writers) - {"green"}
        uppers.append(int(history[-1]["mvsink.upper"]))
        if view not in CHANGED:
            result = check_table(targets[view], view, VIEWS[view], old.expected(view))
            assert result.ok, (view, result.problems[:3])
            continue
        first_green = writers.index("green")
        assert not {"blue0", "blue1"} & set(writers[first_green:]), f"{view}: blue wrote after green's fence"
        switch_version, switch_lower = history[first_green]["version"], int(history[first_green]["mvsink.lower"])
        before = check_table(targets[view], view, VIEWS[view], old.expected(view))
        assert not [v for v in before.bad_times if v < switch_version], (view, before.problems[:3])
        after = check_table(targets[view], view, VIEWS[view],
                            lambda t: (new if t >= switch_lower else old).at(t)[view], from_version=switch_version)
        assert after.ok, (view, after.problems[:3])
        print(f"{view}: green from table version {switch_version} (time {switch_lower}): {after.summary()}")
    assert blue_writers == {"blue0", "blue1"}, "both blue replicas won commits"
    for t in range(min(uppers)):
        views_agree(targets, t)


def test_a_bad_pipeline_stops_the_job_at_start(tmp_path):
    write_deltalake(str(tmp_path / "orders"), pa.table({"id": pa.array([1], pa.int64())}))  # a good source
    (tmp_path / "pipeline.yaml").write_text(f"sources: {{orders: {tmp_path}/orders}}\ntargets: views\n")
    (tmp_path / "v.sql").write_text("-- a view\nCREATE MATERIALIZED VIEW v AS SELECT * FROM nope")
    done = subprocess.run([sys.executable, str(JOB), "--pipeline", str(tmp_path)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{tmp_path}/v.sql:2: view v reads nope" in done.stderr
    assert not (tmp_path / "views").exists()
