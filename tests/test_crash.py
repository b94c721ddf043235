"""kill -9 a replica while it writes and while it commits, at each failpoint in turn; after a restart
the table is right and every orphan is gone."""

from __future__ import annotations

import os
import signal

from deltalake import DeltaTable

from helpers import Replica, create_source, insert, wait_for, write_config
from mvsink.check import caught_up, check_table, expected_from_source


def _upper(tgt):
    return DeltaTable(tgt).transaction_version("mvsink:crashy") if DeltaTable.is_deltatable(tgt) else None


def _committed(tgt):
    return set(DeltaTable(tgt).get_add_actions(flatten=True).column("path").to_pylist())


def _staged(tgt):
    return {f for f in os.listdir(tgt) if f.startswith("mvsink-crashy-")}


FAILPOINTS = ("after-stage", "before-commit", "after-commit")


def test_kill_9_while_writing_or_committing_then_restart(spark, tmp_path):
    """One replica killed at each failpoint in turn, each kill's successor starting on what the
    last one left (staged files, a commit it never saw as won); the last restart cleans every
    orphan up and the table is right at every version."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b")])
    config = write_config(tmp_path / "view.yaml", view_id="crashy", target=tgt, key=["id"],
                          input={"kind": "changes", "source": src})
    logs = tmp_path / "logs"
    logs.mkdir()
    # One replica, started again after each kill (its logs r0-1.log, r0-2.log, ...). Its first
    # start makes the view's first commits, and only then is its failpoint armed.
    replica = Replica(config, "r0", logs)
    armed = tmp_path / "armed"
    orphans: set[str] = set()
    for n, failpoint in enumerate(FAILPOINTS):
        marker = tmp_path / f"frozen-{failpoint}"
        replica.env = {"MVSINK_FAILPOINT": failpoint, "MVSINK_FAILPOINT_MARKER": str(marker),
                       "MVSINK_FAILPOINT_ARMED_BY": str(armed)}
        doomed = replica.start()
        try:
            if n == 0:
                wait_for(lambda: caught_up(tgt, "crashy"), timeout=240, what="the first commits", watch=(doomed,))
                armed.touch()
            upper_before = _upper(tgt)
            insert(spark, src, [(10 + n, "c"), (20 + n, "d")])
            wait_for(marker.exists, timeout=240, what=f"the replica to reach {failpoint}", watch=(doomed,))
        finally:
            doomed.kill(signal.SIGKILL)
        committed = _upper(tgt) > upper_before
        assert committed == (failpoint == "after-commit"), failpoint
        leftovers = _staged(tgt) - _committed(tgt) - orphans
        assert bool(leftovers) == (failpoint != "after-commit"), f"a staged file left behind by the kill at {failpoint}"
        orphans |= leftovers

    spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 1")
    replica.env, replica.extra = {}, ("--orphan-grace-seconds", "0")
    restarted = replica.start()
    try:
        wait_for(lambda: caught_up(tgt, "crashy"), timeout=240, what="catching up", watch=(restarted,))
        wait_for(lambda: not (orphans & _staged(tgt)), timeout=60, what="orphans to be cleaned up", watch=(restarted,))
    finally:
        restarted.kill(signal.SIGTERM)
    result = check_table(tgt, "crashy", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=tgt + "_timeline"))
    assert result.ok, result.problems
    assert _committed(tgt) <= set(os.listdir(tgt)), "cleanup never deletes a committed file"
