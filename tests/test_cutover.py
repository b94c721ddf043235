"""Blue/green cutover between two replica processes, driven by the ``mvsink`` command line.

Blue runs the old definition and writes; green runs a changed definition read-only. ``mvsink
cutover`` waits for green to catch up, stops blue's view and allows green to write. The table's
commits stay contiguous (no gap, no duplicate), every version before green's first commit holds
the old definition, and from green's first commit on the table holds the new one.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers import (ROOT, Replica, create_source, insert, log_history, stop_all, view_upper_of, wait_for,
                     write_config)
from mvsink.check import caught_up, check_table, expected_from_source
from mvsink.replica.controller import Controller

VIEW = "shop"


def shout(row: dict) -> dict:
    return {"id": row["id"], "v": row["v"].upper()}


def mvsink(*args: str, timeout: float = 600) -> str:
    done = subprocess.run([sys.executable, "-m", "mvsink.replica.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_blue_green_cutover_to_a_changed_definition(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b")])
    (tmp_path / "shouting.py").write_text(textwrap.dedent('''
        def shout(row):
            return {"id": row["id"], "v": row["v"].upper()}
    '''))
    old = write_config(tmp_path / "old.yaml", view_id=VIEW, target=tgt, key=["id"],
                       input={"kind": "changes", "source": src})
    new = write_config(tmp_path / "new.yaml", view_id=VIEW, target=tgt, key=["id"],
                       input={"kind": "changes", "source": src, "map_row": "shouting.py:shout",
                              "output_schema": "id BIGINT, v STRING"})
    blue = Replica(None, "blue", tmp_path, listen=True).start()
    green = Replica(None, "green", tmp_path, "--read-only", listen=True).start()
    try:
        out = mvsink("--replica", blue.address, "create", "--config", str(old))
        assert f"view {VIEW} created" in out
        with Controller(blue.address, timeout=300) as ctl:
            ctl.connect()
            wait_for(lambda: caught_up(tgt, VIEW), timeout=300, what="blue to catch up", watch=(blue,))
            ctl.wait_frontier(VIEW, view_upper_of(tgt, VIEW))
        mvsink("--replica", green.address, "create", "--config", str(new))
        for i in range(3, 6):
            insert(spark, src, [(i, f"v{i}")])
        status = mvsink("--replica", green.address, "status")
        assert "replica green: read-only" in status and f"view {VIEW}:" in status

        out = mvsink("cutover", VIEW, "--old", blue.address, "--new", green.address)
        assert f"{green.address} writes from frontier" in out
        insert(spark, src, [(6, "v6")])
        with Controller(green.address, timeout=300) as ctl:
            ctl.connect()
            assert not ctl.status().read_only
            wait_for(lambda: caught_up(tgt, VIEW), timeout=300, what="green to catch up", watch=(green,))
            ctl.wait_frontier(VIEW, view_upper_of(tgt, VIEW))
        assert "view shop: " not in mvsink("--replica", blue.address, "status"), "blue dropped the view"
        peeked = mvsink("--replica", green.address, "peek", VIEW, "--where", "id = 6")
        assert "V6" in peeked

        history = [h for h in reversed(log_history(tgt)) if h.get("mvsink.view") == VIEW]
        writers = [h["mvsink.replica"] for h in history]
        first_green = writers.index("green")
        assert "blue" not in writers[first_green:], "blue wrote after the cutover"
        switch_version, switch_lower = history[first_green]["version"], int(history[first_green]["mvsink.lower"])
        old_view = expected_from_source(src, ["id", "v"], timeline=tgt + "_timeline")
        new_view = expected_from_source(src, ["id", "v"], map_row=shout, timeline=tgt + "_timeline")
        before = check_table(tgt, VIEW, ["id", "v"], old_view)
        assert not [v for v in before.bad_times if v < switch_version], before.problems
        after = check_table(tgt, VIEW, ["id", "v"],
                            lambda t: new_view(t) if t >= switch_lower else old_view(t),
                            from_version=switch_version)
        assert after.ok, after.problems  # includes: the commits are contiguous
        print(f"cutover at table version {switch_version} (time {switch_lower}): {after.summary()}")
    finally:
        stop_all([blue, green])


def test_a_replica_running_several_views_is_cut_over_whole(spark, tmp_path):
    """Allowing a replica to write promotes every view it runs: ``mvsink cutover VIEW`` is refused
    (exit 1, nothing changed) where the new replica runs other views, which blue would keep
    writing; ``--all`` cuts them all over and names each."""
    src = str(tmp_path / "src")
    create_source(spark, src, [(1, "a"), (2, "b")])
    configs = {view: write_config(tmp_path / f"{view}.yaml", view_id=view, target=str(tmp_path / view), key=["id"],
                                  input={"kind": "changes", "source": src}) for view in ("shop", "till")}
    blue = Replica(None, "blue", tmp_path, listen=True).start()
    green = Replica(None, "green", tmp_path, "--read-only", listen=True).start()
    try:
        for replica in (blue, green):
            for config in configs.values():
                mvsink("--replica", replica.address, "create", "--config", str(config))
        with Controller(green.address, timeout=300) as ctl:
            ctl.connect()
            for view in configs:
                wait_for(lambda: caught_up(str(tmp_path / view), view), timeout=300, what=f"blue to write {view}",
                         watch=(blue, green))
                ctl.wait_frontier(view, view_upper_of(str(tmp_path / view), view))

        refused = subprocess.run([sys.executable, "-m", "mvsink.replica.cli", "cutover", "shop", "--old",
                                  blue.address, "--new", green.address], capture_output=True, text=True,
                                 timeout=600, cwd=ROOT)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "also runs views ['till']" in refused.stderr and "--all" in refused.stderr, refused.stderr
        assert "replica green: read-only" in mvsink("--replica", green.address, "status"), "nothing changed"
        assert all(f"view {v}:" in mvsink("--replica", blue.address, "status") for v in configs)

        out = mvsink("cutover", "--all", "--old", blue.address, "--new", green.address)
        assert "cutover of 2 views shop, till:" in out and f"{blue.address} has dropped them" in out, out
        insert(spark, src, [(3, "c")])
        with Controller(green.address, timeout=300) as ctl:
            ctl.connect()
            assert not ctl.status().read_only
            for view in configs:
                wait_for(lambda: caught_up(str(tmp_path / view), view), timeout=300, what=f"green to write {view}",
                         watch=(green,))
        assert "no views" in mvsink("--replica", blue.address, "status")
        for view in configs:
            writers = [h["mvsink.replica"] for h in reversed(log_history(str(tmp_path / view)))
                       if h.get("mvsink.view") == view]
            assert writers[-1] == "green" and "blue" not in writers[writers.index("green"):], writers
    finally:
        stop_all([blue, green])
