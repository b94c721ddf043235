"""Cutover plans: a read-only replica of a changed definition shows the updates its first commit
would write (``mvsink plan``); ``mvsink cutover --max-plan-rows`` refuses a larger plan with nothing
changed; once promoted, the replica's first commit makes exactly the plan's change to the table's rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from urllib.parse import unquote

import pyarrow.parquet as pq

from helpers import ROOT, Replica, create_source, log_history, stop_all, view_upper_of, wait_for, write_config
from mvsink.check import caught_up
from mvsink.replica.controller import Controller
from mvsink.table import latest_version, log_actions

VIEW = "shop"
COLUMNS = ("id", "v", "_mv_error", "_mv_time", "_mv_diff")


def mvsink(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "mvsink.replica.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert done.returncode == expect, done.stdout + done.stderr
    return done


def commits_by(target: str, replica: str) -> list[dict]:
    return [h for h in log_history(target) if h.get("mvsink.replica") == replica]


def committed_change(target: str, version: int) -> dict:
    """The rows table ``version`` added minus the rows it removed (the table layout: each a
    plain row), row -> signed count."""
    change = Counter()
    for action in log_actions(target, version):
        for kind, sign in (("add", 1), ("remove", -1)):
            if kind in action:
                table = pq.read_table(os.path.join(target, unquote(action[kind]["path"])), columns=["id", "v"])
                for r in table.to_pylist():
                    change[(r["id"], r["v"])] += sign
    return {row: n for row, n in change.items() if n}


def test_the_plan_is_what_the_promoted_replica_commits_first(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b"), (3, "c"), (4, "d")])
    (tmp_path / "v2.py").write_text(textwrap.dedent('''
        def v2(row):  # drops 2, shouts the odd ones
            if row["id"] == 2:
                return None
            return {"id": row["id"], "v": row["v"].upper() if row["id"] % 2 else row["v"]}
    '''))
    old = write_config(tmp_path / "old.yaml", view_id=VIEW, target=tgt, key=["id"],
                       input={"kind": "changes", "source": src})
    new = write_config(tmp_path / "new.yaml", view_id=VIEW, target=tgt, key=["id"],
                       input={"kind": "changes", "source": src, "map_row": "v2.py:v2",
                              "output_schema": "id BIGINT, v STRING"})
    blue = Replica(None, "blue", tmp_path, listen=True).start()
    green = Replica(None, "green", tmp_path, "--read-only", listen=True).start()
    try:
        mvsink("--replica", blue.address, "create", "--config", str(old))
        wait_for(lambda: caught_up(tgt, VIEW), timeout=300, what="blue to catch up", watch=(blue,))
        mvsink("--replica", green.address, "create", "--config", str(new))
        upper = view_upper_of(tgt, VIEW)
        with Controller(green.address, timeout=300) as ctl:
            ctl.connect()
            ctl.wait_frontier(VIEW, upper)
            view = ctl.wait_status(lambda s: s.views[VIEW]["hydrated"], "green's hydration").views[VIEW]
            # What the hydration left to write against blue's table: -(1,a) +(1,A) -(2,b) -(3,c) +(3,C).
            assert not view["hydrating"] and view["hydration_rows"] == 5 and view["hydration_seconds"] > 0, view

        plan = json.loads(mvsink("--replica", green.address, "plan", VIEW, "--json").stdout)
        # The sources are idle and the table has every time: the difference goes to a repair time.
        assert (plan["lower"], plan["upper"]) == (upper, upper + 1), plan
        planned = Counter(tuple(r[c] for c in COLUMNS) for r in plan["rows"])
        assert planned == Counter({(1, "a", None, upper, -1): 1, (1, "A", None, upper, 1): 1,
                                   (2, "b", None, upper, -1): 1, (3, "c", None, upper, -1): 1,
                                   (3, "C", None, upper, 1): 1}), plan["rows"]
        assert (plan["updates"], plan["added"], plan["removed"]) == (5, 2, 3)
        shown = mvsink("--replica", green.address, "plan", VIEW, "--limit", "2").stdout
        assert f"writes [{upper}, {upper + 1}): 5 updates, +2 rows, -3 rows" in shown and "3 more updates" in shown

        unknown = mvsink("--replica", green.address, "plan", "nope", expect=1)
        assert "no view 'nope'" in unknown.stderr, unknown.stderr

        version = latest_version(tgt)
        refused = mvsink("cutover", VIEW, "--old", blue.address, "--new", green.address,
                         "--max-plan-rows", "4", expect=1)
        assert "would write 5 updates" in refused.stderr and "--max-plan-rows 4" in refused.stderr, refused.stderr
        with Controller(blue.address) as b, Controller(green.address) as g:
            assert VIEW in b.connect().status().views and not b.status().read_only, "blue still writes"
            assert g.connect().status().read_only, "green still read-only"
        time.sleep(3)  # several of green's steps: it writes nothing
        assert latest_version(tgt) == version and not commits_by(tgt, "green")

        mvsink("cutover", VIEW, "--old", blue.address, "--new", green.address, "--max-plan-rows", "5")
        # Green's first commit raises the fence to its definition (issue 26), writing nothing;
        # the next one writes the plan.
        fence, *_ = wait_for(lambda: commits_by(tgt, "green"), timeout=120, what="green's first commit",
                             watch=(green,))[::-1]
        assert fence["mvsink.reason"] == "fence" and not committed_change(tgt, fence["version"])
        first = wait_for(lambda: [c for c in commits_by(tgt, "green") if c["mvsink.reason"] != "fence"],
                         timeout=120, what="green's first commit that writes", watch=(green,))[-1]
        assert (int(first["mvsink.lower"]), int(first["mvsink.upper"])) == (upper, upper + 1), first
        planned_change = Counter()
        for (id_, v, _error, _time, diff), n in planned.items():
            planned_change[(id_, v)] += diff * n
        assert committed_change(tgt, first["version"]) == dict(planned_change)
    finally:
        stop_all([blue, green])
