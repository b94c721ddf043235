"""What a step costs, and that the cheaper paths compute the same: adopted own commits, the step
profile, snapshot differences by consolidation."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from helpers import create_source, foreign_append_before_commit, insert
from mvsink import ChangesInput, MaterializedView, SnapshotInput, ViewDefinition, read_view, view_errors, view_upper
from mvsink import sink as sink_module
from mvsink.check import check_table, expected_from_source
from mvsink.desired.key_check import KeyRanges
from mvsink.metrics import render
from mvsink.step_profile import PHASES
from mvsink.table import latest_version
from mvsink.timeline import REASON_SOURCES


def test_a_caught_up_step_loads_no_table_and_makes_four_calls_into_the_jvm(spark, tmp_path, monkeypatch):
    """What an idle view costs at each poll: the target's log listed, no Delta table loaded, and
    only the step profile's job tag (set, removed) and its jobs (listed, counted) in the JVM; a new
    version is loaded and read."""
    from py4j import protocol
    from py4j.java_gateway import GatewayClient

    import mvsink.append

    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b")])
    mv = MaterializedView(spark, ViewDefinition("idle", tgt, ChangesInput(src), key=("id",), replica_id="r1"))
    mv.run_until_caught_up()
    mv.step()  # the last commit read back by a poll (an adopted one is read as the table again)
    calls = Counter()
    send, load = GatewayClient.send_command, mvsink.append.DeltaTable

    def counted_send(self, command, *args, **kwargs):
        # py4j's freeing of Python's references (of this step's objects or, from its finalizer
        # thread, of any earlier test's) is not a call the step makes
        if not command.startswith(protocol.MEMORY_COMMAND_NAME + protocol.MEMORY_DEL_SUBCOMMAND_NAME):
            calls["jvm"] += 1
        return send(self, command, *args, **kwargs)

    def counted_load(*args, **kwargs):
        calls["table loads"] += 1
        return load(*args, **kwargs)

    monkeypatch.setattr(GatewayClient, "send_command", counted_send)
    monkeypatch.setattr(mvsink.append, "DeltaTable", counted_load)
    for _ in range(3):
        idle = mv.step()
        assert idle.desc is None and idle.spark_jobs == dict.fromkeys(idle.phase_seconds, 0), idle
    assert calls == {"jvm": 3 * 4}, calls
    monkeypatch.undo()
    insert(spark, tgt, [(9, "z")])  # a foreign commit: a new version, loaded, read and repaired
    monkeypatch.setattr(mvsink.append, "DeltaTable", counted_load)
    repaired = mv.step()
    assert calls["table loads"] >= 1 and repaired.repairs == 1 and repaired.spark_jobs["commit"] == 0, repaired
    assert sum(repaired.spark_jobs.values()) >= 1, repaired


def test_own_commit_is_adopted_and_a_caught_up_step_runs_no_spark_job(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b")])
    mv = MaterializedView(spark, ViewDefinition("cheap", tgt, ChangesInput(src), key=("id",), replica_id="r1"))
    mv.run_until_caught_up()
    insert(spark, src, [(3, "c")])
    wrote = mv.step()
    assert wrote.appended and wrote.files == 1
    # Read back without reading: the read-back is at the commit's version already.
    assert mv.readback.version == latest_version(tgt)
    assert set(wrote.phase_seconds) >= {"readback", "mint", "input", "correction", "key_check", "staging", "commit"}
    assert list(wrote.phase_seconds) == [p for p in PHASES if p in wrote.phase_seconds]
    assert wrote.spark_jobs["input"] >= 1 and wrote.spark_jobs["staging"] >= 1
    idle = mv.step()
    assert idle.desc is None and idle.corrections == 0
    assert sum(idle.spark_jobs.values()) == 0, idle
    text = render({"cheap": mv})
    assert 'mvsink_phase_seconds_total{view="cheap",replica="r1",phase="staging"}' in text
    assert 'mvsink_phase_spark_jobs_total{view="cheap",replica="r1",phase="input"}' in text
    # the hydration and the change feed's step, counted by strategy
    assert 'mvsink_steps_by_strategy_total{view="cheap",replica="r1",strategy="hydration"} 1' in text
    assert 'mvsink_steps_by_strategy_total{view="cheap",replica="r1",strategy="change feed"} 1' in text
    result = check_table(tgt, "cheap", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=mv.view.timeline))
    assert result.ok, result.problems


def test_a_foreign_commit_just_before_the_own_commit_is_read_and_repaired(spark, tmp_path, monkeypatch):
    """The own commit is not the next version after the read-back: nothing is adopted, the
    read-back reads both, and the foreign rows are undone at every time."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    mv = MaterializedView(spark, ViewDefinition("race", tgt, ChangesInput(src), key=("id",), replica_id="r1",
                                                layout="updates"))  # the table layout's: test_table_layout.py
    mv.run_until_caught_up()
    insert(spark, src, [(2, "b")])
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("_mv_time", pa.int64()),
                        ("_mv_diff", pa.int64()), ("_mv_error", pa.string())])
    foreign = pa.table({"id": [99], "v": ["bogus"], "_mv_time": [0], "_mv_diff": [1], "_mv_error": [None]},
                       schema=schema)
    landed = foreign_append_before_commit(monkeypatch, tgt, foreign)
    report = mv.step()
    monkeypatch.undo()
    assert landed and report.appended
    assert mv.readback.version < latest_version(tgt)  # not adopted
    mv.run_until_caught_up()
    assert {tuple(r) for r in read_view(spark, tgt, "race").collect()} == {(1, "a"), (2, "b")}
    result = check_table(tgt, "race", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=mv.view.timeline),
                         from_version=latest_version(tgt))  # repaired: every time right again
    assert result.ok and result.versions_checked == 1, result.problems


def test_snapshot_differences_keep_multiplicities(spark, tmp_path):
    """A keyless query with duplicate rows: the consolidated difference of two results is the
    multiset difference (a copy more, a copy less, a row gone, a row new)."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (1, "a"), (2, "b"), (3, "c"), (3, "c"), (3, "c")])
    mv = MaterializedView(spark, ViewDefinition(
        "bag", tgt, SnapshotInput(sql="SELECT id, v FROM src"), sources={"src": src}, replica_id="r1"))
    mv.run_until_caught_up()
    expected = [Counter({(1, "a"): 2, (2, "b"): 1, (3, "c"): 3})]
    insert(spark, src, [(1, "a"), (4, "d")])                       # a third copy, a new row
    expected.append(expected[-1] + Counter({(1, "a"): 1, (4, "d"): 1}))
    mv.run_until_caught_up()
    spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 2")            # a row gone
    insert(spark, src, [(3, "c")])
    expected.append(expected[-1] - Counter({(2, "b"): 1}) + Counter({(3, "c"): 1}))
    mv.run_until_caught_up()
    upper = mv.observed_upper
    seen = [Counter(tuple(r) for r in read_view(spark, tgt, "bag", t).collect()) for t in range(upper)]
    assert seen[0] == expected[0] and seen[-1] == expected[-1]
    assert expected[1] in seen


def _errors(spark, tgt: str, view_id: str) -> list[str]:
    """The view's error messages at its latest time (kept apart from its rows)."""
    return sorted(r[0] for r in view_errors(spark, tgt, view_upper(tgt, view_id) - 1, view_id).collect())


@pytest.mark.parametrize("rows, unique", [
    ([(1, "a"), (2, "b"), (3, "c"), (None, "no key")], True),        # one error row: still unique
    ([(1, "a"), (1, "b"), (2, "c")], False),                           # a key twice
    ([(1, "a"), (1, "a"), (2, "c")], False),                           # a row twice: consolidate it
    ([(1, "a"), (None, "x"), (None, "y")], False),                     # two error rows
])
def test_hydration_holds_a_snapshot_unique_by_key_as_it_is(spark, tmp_path, monkeypatch, rows, unique):
    """Hydrating into an empty table: a snapshot with one row per key becomes the buffer without
    consolidation or key check, and commits exactly what the full fold and key check commit."""
    src = str(tmp_path / "src")
    create_source(spark, src, rows)

    def hydrate(name: str) -> tuple[Counter, dict]:
        tgt = str(tmp_path / name)
        mv = MaterializedView(spark, ViewDefinition(name, tgt, ChangesInput(src), key=("id",), replica_id="r1"))
        report = mv.step()
        assert report.appended and mv.correction.size == 0, report
        rows = Counter(tuple(r) for r in spark.read.format("delta").load(tgt).collect())
        return (rows, _errors(spark, tgt, name)), report.spark_jobs

    fast, fast_jobs = hydrate("fast")
    not_unique = lambda updates, key: (updates.count(), False)  # noqa: E731
    monkeypatch.setattr(sink_module, "unique_keys", not_unique)
    monkeypatch.setattr(sink_module, "unique_keys_by_shuffle", not_unique)
    monkeypatch.setattr(KeyRanges, "settle", staticmethod(lambda parts: None))
    full, full_jobs = hydrate("full")
    assert fast == full
    assert (fast_jobs["correction"] == 0) == unique, fast_jobs  # the fold ran only if not unique
    if unique:  # settled by the staging's own tasks: the snapshot was read once
        assert fast_jobs.get("key_check", 0) == 0 and fast_jobs["staging"] >= 1, fast_jobs
    assert full_jobs["correction"] >= 1
    errors = fast[1]
    assert any(e.startswith("duplicate key") for e in errors) == (not unique and rows[1][0] is not None), errors


@pytest.mark.parametrize("layout", ["in key order", "keys scattered", "a key repeated", "read-only"])
def test_a_hydration_checks_its_keys_on_the_files_it_stages(spark, tmp_path, layout):
    """A keyed hydration into an empty table learns whether its keys are unique from the key
    ranges its staging tasks report. Files in disjoint key ranges settle it: the snapshot is read
    once. Overlapping ranges leave it to one shuffle of the keys. A repeated key: the staged
    files (the rows unconsolidated) are deleted, the snapshot is folded and checked as any fold
    is, and the table gets the view with its key error. A read-only replica stages nothing and
    checks the keys on their own. Each way, the table ends as the view, with no file left over."""
    import os

    from deltalake import DeltaTable

    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    ids = list(range(600)) + ([7] if layout == "a key repeated" else [])
    rows = spark.createDataFrame([(i, f"v{i}") for i in ids], "id BIGINT, v STRING")
    rows = rows if layout == "in key order" else rows.repartition(3)  # round robin: ranges overlap
    rows.write.format("delta").option("delta.enableChangeDataFeed", "true").save(src)
    definition = ViewDefinition("keyed", tgt, ChangesInput(src), key=("id",), replica_id="r1",
                                read_only=layout == "read-only")
    mv = MaterializedView(spark, definition)
    if layout == "read-only":  # a time minted as a writer would: the replica hydrates, writing nothing
        mv.timeline.extend(mv.desired.latest_versions(), REASON_SOURCES, at=0)
    first = mv.step()
    if layout == "read-only":
        assert first.desc is None and first.spark_jobs["key_check"] >= 1 and first.corrections == 600, first
        mv.allow_writes()
        first = mv.step()
    assert first.appended and first.corrections == len(set(ids)) + (layout == "a key repeated"), first
    jobs = first.spark_jobs
    assert (jobs.get("key_check", 0) == 0) == (layout in ("in key order", "read-only")), jobs
    assert (jobs.get("correction", 0) >= 1) == (layout == "a key repeated"), jobs
    committed = set(DeltaTable(tgt).get_add_actions(flatten=True).column("path").to_pylist())
    assert {f for f in os.listdir(tgt) if f.endswith(".parquet")} == committed
    rows = Counter(tuple(r) for r in read_view(spark, tgt, "keyed", errors="ignore").collect())
    repeated = {i for i in ids if ids.count(i) > 1}  # a repeated key's rows are withheld
    assert rows == Counter((i, f"v{i}") for i in ids if i not in repeated)
    assert _errors(spark, tgt, "keyed") == (['duplicate key {"id":7}: 2 rows'] if layout == "a key repeated" else [])


def test_a_hydration_whose_staging_fails_hydrates_again(spark, tmp_path, monkeypatch):
    """A staging that fails while the held snapshot's keys are unchecked leaves a buffer not known
    to be right: the replica forgets it and the next step hydrates again, with the key error."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b"), (2, "c")])
    real, calls = sink_module.stage_plain, []  # the table layout's staging

    def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("no space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(sink_module, "stage_plain", fails_once)
    mv = MaterializedView(spark, ViewDefinition("again", tgt, ChangesInput(src), key=("id",), replica_id="r1"))
    with pytest.raises(OSError, match="no space"):
        mv.step()
    assert mv.desired_frontier is None and mv.correction.size == 0
    mv.run_until_caught_up()
    assert mv.hydrations == 2
    rows = Counter(tuple(r) for r in read_view(spark, tgt, "again", errors="ignore").collect())
    assert rows == Counter([(1, "a")])  # key 2's two rows withheld
    assert _errors(spark, tgt, "again") == ['duplicate key {"id":2}: 2 rows']


def test_the_step_profile_counts_a_step_whose_jobs_the_status_store_dropped(spark):
    """A step may run more Spark jobs than the session's status store keeps (``spark.ui.retainedJobs``;
    this suite's session keeps 50): a job dropped between listing the step's jobs and reading its
    submission time is of no known time, not an error that fails the step (it did, in CI)."""
    from mvsink.step_profile import StepProfile, _submitted_millis

    store = spark.sparkContext._jsc.sc().statusStore()
    assert _submitted_millis(store, 2**31 - 1) == float("inf")  # a job the store does not hold
    profile = StepProfile(spark)
    with profile.tagged(), profile.phase("input"):
        for _ in range(60):
            spark.range(1).count()
    with profile.tagged():
        profile.count_jobs()
    assert 0 < profile.spark_jobs["input"] <= 60
