"""The sink end to end in one process: changes and snapshot inputs, reading the view."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from pyspark.sql import functions as F

from helpers import create_source, insert, wait_for
from mvsink import (ChangesInput, MaterializedView, NotReadable, SnapshotInput, ViewDefinition,
                    read_view, register_temp_view, view_since, view_upper)
from mvsink.check import TimelineReader, check_table, expected_from_source
from mvsink.table import latest_version


def _edits(spark, src):
    """Versions 2..5 of the source: inserts, an update, a delete, a mixed commit."""
    yield insert(spark, src, [(4, "d"), (5, "e")])
    yield spark.sql(f"UPDATE delta.`{src}` SET v = 'bb' WHERE id = 2")
    yield spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 3")
    yield spark.sql(f"MERGE INTO delta.`{src}` t USING (SELECT 1 AS id, 'aa' AS v UNION ALL SELECT 6, 'f') s "
                    "ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")


def test_changes_view_equals_the_source_at_every_time(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b"), (3, "c")])
    view = ViewDefinition("orders", tgt, ChangesInput(src), key=("id",), replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()                   # time 0: source version 1
    for _ in _edits(spark, src):               # times 1..4: versions 2..5, one step each
        mv.run_until_caught_up()
    insert(spark, src, [(7, "g")])
    insert(spark, src, [(8, "h")])
    report = mv.run_until_caught_up()          # time 5: versions 6 and 7 at once
    assert report.upper == 6 and report.corrections == 0
    timeline = TimelineReader(view.timeline)
    assert [timeline.version(t) for t in range(6)] == [1, 2, 3, 4, 5, 7]
    result = check_table(tgt, "orders", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=view.timeline))
    assert result.ok, result.problems
    assert result.times_checked == 6  # table versions 1..6, each holding the one time it committed
    plain = Counter(tuple(r) for r in spark.read.format("delta").load(tgt).collect())
    assert plain == Counter({(1, "aa"): 1, (2, "bb"): 1, (4, "d"): 1, (5, "e"): 1, (6, "f"): 1, (7, "g"): 1,
                             (8, "h"): 1}), "any Delta reader sees the view's rows"

    assert view_upper(tgt, "orders") == 6 and view_since(tgt, "orders") == 0
    at3 = Counter(tuple(r) for r in read_view(spark, tgt, "orders", 3).collect())
    assert at3 == Counter({(1, "a"): 1, (2, "bb"): 1, (4, "d"): 1, (5, "e"): 1})
    latest = {tuple(r) for r in read_view(spark, tgt, "orders").collect()}
    assert latest == {(1, "aa"), (2, "bb"), (4, "d"), (5, "e"), (6, "f"), (7, "g"), (8, "h")}
    name = register_temp_view(spark, tgt, "orders", "orders_now")
    assert spark.sql(f"SELECT count(*) AS n FROM {name} WHERE id > 4").first().n == 4
    with pytest.raises(NotReadable):
        read_view(spark, tgt, "orders", 6)


def test_steady_state_writes_only_progress_when_nothing_changes(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    mv = MaterializedView(spark, ViewDefinition("idle", tgt, ChangesInput(src), replica_id="r1"))
    mv.run_until_caught_up()
    files_before = set((tmp_path / "tgt").iterdir())
    report = mv.step()
    assert report.desc is None, "no source change, no description"
    spark.sql(f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES ('x' = 'y')")  # a version without changes
    report = mv.run_until_caught_up()
    new_files = {p for p in set((tmp_path / "tgt").iterdir()) - files_before if p.suffix == ".parquet"}
    assert report.upper == 2 and not new_files, "an empty correction stages no file"


def _count_by_v(df):
    return df.groupBy("v").agg(F.count("*").alias("n"), F.sum("id").alias("total"))


def test_snapshot_view_of_an_aggregate_equals_the_query_at_every_version(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "x"), (2, "y"), (3, "x")])
    view = ViewDefinition("counts", tgt, SnapshotInput(src, _count_by_v), key=("v",), replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    insert(spark, src, [(4, "y"), (5, "z")])
    spark.sql(f"DELETE FROM delta.`{src}` WHERE v = 'z'")
    mv.step()  # two versions in one step
    spark.sql(f"UPDATE delta.`{src}` SET v = 'y' WHERE id = 1")
    mv.run_until_caught_up()

    source_at = expected_from_source(src, ["id", "v"], timeline=view.timeline)

    def expected(t):
        by_v = {}
        for (id_, v), n in source_at(t).items():
            count, total = by_v.get(v, (0, 0))
            by_v[v] = (count + n, total + id_ * n)
        return Counter({(v, c, s): 1 for v, (c, s) in by_v.items()})

    result = check_table(tgt, "counts", ["v", "n", "total"], expected)
    assert result.ok, result.problems
    assert {tuple(r) for r in read_view(spark, tgt, "counts").collect()} == {("x", 1, 3), ("y", 3, 7)}


def test_a_step_that_fails_midway_loses_nothing(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    view = ViewDefinition("flaky", tgt, ChangesInput(src), key=("id",), replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    insert(spark, src, [(2, "b")])
    spark.sql(f"UPDATE delta.`{src}` SET v = 'aa' WHERE id = 1")
    real_apply, real_hold = mv.correction.apply, mv.correction.hold

    def fail_once(*args, **kwargs):
        mv.correction.apply, mv.correction.hold = real_apply, real_hold
        raise OSError("injected: executor lost")

    # The failure strikes after the input was read, as it goes into the buffer (folded, or held
    # as it is: the steady state).
    mv.correction.apply = mv.correction.hold = fail_once
    with pytest.raises(OSError, match="injected"):
        mv.step()
    mv.run_until_caught_up()
    result = check_table(tgt, "flaky", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=view.timeline))
    assert result.ok, result.problems
    assert {tuple(r) for r in read_view(spark, tgt, "flaky").collect()} == {(1, "aa"), (2, "b")}


def test_a_view_stepped_on_a_timer_keeps_up_stops_between_steps_and_ends_on_repeated_failures(spark, tmp_path):
    """``start_stream`` steps the view every trigger on a thread of its own (no streaming query:
    Spark runs no micro-batch); ``stop_stream`` lets the running step end and starts no other. A
    step that fails is retried at the next tick; ``max_consecutive_failures`` in a row end the loop
    with the error kept, and a new loop carries on from the view's state."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    mv = MaterializedView(spark, ViewDefinition("timed", tgt, ChangesInput(src), key=("id",), replica_id="r1"),
                          max_consecutive_failures=2)
    rows = lambda: {tuple(r) for r in spark.read.format("delta").load(tgt).collect()}  # noqa: E731
    ticks: list[int] = []
    loop = mv.start_stream(trigger_seconds=0.2, after_step=lambda: ticks.append(mv.steps))
    try:
        insert(spark, src, [(2, "b")])
        wait_for(lambda: latest_version(tgt) is not None and rows() == {(1, "a"), (2, "b")},
                 timeout=120, interval=0.2, what="the view to hold the source's rows")
        assert loop.isActive and not spark.streams.active, "no streaming query steps the view"
    finally:
        mv.stop_stream(loop)
    assert not loop.isActive and loop.exception() is None
    stopped_after = len(ticks)
    insert(spark, src, [(3, "c")])
    time.sleep(1.0)  # five triggers' worth: nothing may happen
    assert len(ticks) == stopped_after and rows() == {(1, "a"), (2, "b")}, "no step after the stop"

    real_step, calls = mv.step, []

    def failing_step():
        calls.append(1)
        raise OSError("injected: the target is unreachable")

    mv.step = failing_step
    loop = mv.start_stream(trigger_seconds=0.1)
    assert loop.awaitTermination(60), "the loop ends after max_consecutive_failures failures in a row"
    assert len(calls) == 2 and "injected" in str(loop.exception())
    mv.step = real_step
    loop = mv.start_stream(trigger_seconds=0.1)
    try:
        wait_for(lambda: rows() == {(1, "a"), (2, "b"), (3, "c")}, timeout=120, interval=0.2,
                 what="a new loop to catch up")
    finally:
        mv.stop_stream(loop)
