"""Compaction in the update layout advances a view's since and rewrites the files holding older times, through
the CAS (the table layout's compaction of small files: test_table_layout.py)."""

from __future__ import annotations

import json
import os
from collections import Counter
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from helpers import create_source, insert, list_files
from mvsink import (ChangesInput, MaterializedView, NotReadable, ViewDefinition, read_view, view_since,
                    view_upper)
import mvsink.append.compact as compaction
from mvsink.append import Shard, compare_and_append
from mvsink.append.compact import CompactionResult, compact, files_below
from mvsink.check import TimelineReader
from mvsink.cleanup import referenced_files
from mvsink.mint import Description
from mvsink.target.read import newest_first, updates
from mvsink.target.create import create_target
from mvsink.updates import TIME, contents_at, table_schema
from mvsink.write import StagedBatch, StagedFile, staged_prefix
from mvsink.write.stats import FileStats

SCHEMA = table_schema(T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())]))


def _contents(spark, target: str, times: range) -> dict[int, Counter]:
    """contents_at for each of ``times``, in one Spark job."""
    table = updates(spark, target)
    at = [contents_at(table, t).withColumn("_t", F.lit(t)) for t in times]
    rows = reduce(DataFrame.unionByName, at).collect()
    return {t: Counter(tuple(r)[:-1] for r in rows if r._t == t) for t in times}


def _min_time(target: str) -> int:
    return pc.min(DeltaTable(target).to_pyarrow_table(columns=[TIME]).column(TIME)).as_py()


def _log_entry(target: str, version: int) -> list[dict]:
    with open(os.path.join(target, "_delta_log", f"{version:020d}.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _updates_table(tmp_path, view_id: str, history: list[tuple]) -> tuple[ViewDefinition, Shard]:
    """A target table of view ``view_id`` holding ``history``, one append per time."""
    view = ViewDefinition(view_id, str(tmp_path / "t"), ChangesInput(str(tmp_path / "src")),
                          replica_id="writer", layout="updates")
    create_target(view, SCHEMA)
    writer = Shard(view.target, view.app_id, view_id, "writer")
    for t in sorted({u[3] for u in history}):
        _append(writer, Description(t, t + 1), [u for u in history if u[3] == t])
    return view, writer


def _paths(table: DeltaTable) -> list[str]:
    return table.get_add_actions(flatten=True).column("path").to_pylist()


def _append(shard: Shard, desc: Description, rows: list[tuple]) -> None:
    """Stage ``rows`` as one file (through pyarrow, Spark is slow to start a job) and append it."""
    arrow = to_arrow_schema(SCHEMA)
    batch = pa.RecordBatch.from_pylist([dict(zip(arrow.names, row)) for row in rows], schema=arrow)
    name = f"{staged_prefix(shard.view_id, desc, shard.replica_id)}-0.parquet"
    path = os.path.join(shard.target, name)
    pq.write_table(pa.Table.from_batches([batch]), path)
    stats = FileStats(arrow)
    stats.add(batch)
    files = [StagedFile(name, os.path.getsize(path), len(rows), stats.to_json())]
    staged = StagedBatch(desc, shard.target, files)
    assert compare_and_append(shard, desc, staged, "correction").appended


def _before_first_commit(shard: Shard, action) -> list[tuple]:
    """Run ``action`` just before ``shard``'s next commit; returns the list its commits go to."""
    pending, attempts = [action], []
    commit = shard.commit

    def hooked(table, *args, **kwargs):
        attempts.append(args)
        if pending:
            pending.pop()()
        return commit(table, *args, **kwargs)

    shard.commit = hooked
    return attempts


def _expected(history: list[tuple], t: int) -> Counter:
    """Contents at ``t`` of updates ``(id, v, error, time, diff)``, consolidated in Python."""
    sums = Counter()
    for *row, time, diff in history:
        if time <= t:
            sums[tuple(row)] += diff
    return Counter({row: n for row, n in sums.items() if n > 0})


#: Updates (id, v, error, time, diff): a row replaced, rows deleted, an error that comes and goes.
HISTORY = [
    (1, "a", None, 0, 1), (2, "b", None, 0, 1), (2, "b", None, 1, -1), (2, "bb", None, 1, 1),
    (3, "c", None, 2, 1), (None, None, "boom", 2, 1), (None, None, "boom", 3, -1), (1, "a", None, 3, -1),
    (4, "d", None, 3, 1), (3, "c", None, 4, -1), (5, "e", None, 5, 1), (5, "e", None, 5, 1),
]


def test_compaction_advances_old_times_in_one_commit_and_keeps_the_readable_contents(spark, tmp_path):
    view, _ = _updates_table(tmp_path, "c", HISTORY)
    tgt = view.target
    assert view_upper(tgt, "c") == 6 and view_since(tgt, "c") == 0
    before = _contents(spark, tgt, range(3, 6))
    assert before == {t: _expected(HISTORY, t) for t in range(3, 6)}
    table = DeltaTable(tgt)
    below = {path for path, _ in files_below(table, 3)}
    kept = set(_paths(table)) - below
    assert len(below) == 3 and len(kept) == 3, "one file per time, by their statistics"

    shard = Shard(tgt, view.app_id, "c", "compactor")
    result = compact(spark, shard, SCHEMA, 3)
    assert result.since == 3 and result.version == DeltaTable(tgt).version()
    assert result.files_removed == 3 and result.files_added == 1

    assert _contents(spark, tgt, range(3, 6)) == before
    assert _min_time(tgt) == 3, "no update below the frontier remains"
    assert files_below(DeltaTable(tgt), 3) == []
    added = set(_paths(DeltaTable(tgt))) - kept
    assert kept <= set(_paths(DeltaTable(tgt))), "files above the frontier are not rewritten"
    rewritten = Counter(tuple(r.values()) for p in added
                        for r in pq.read_table(os.path.join(tgt, p)).to_pylist())
    assert rewritten == Counter([(1, "a", None, 3, 1), (2, "bb", None, 3, 1), (3, "c", None, 3, 1),
                                 (None, None, "boom", 3, 1)]), "advanced to 3 and consolidated, zeros dropped"

    entry = _log_entry(tgt, result.version)
    removes = [a["remove"] for a in entry if "remove" in a]
    adds = [a["add"] for a in entry if "add" in a]
    assert {r["path"] for r in removes} == below and {a["path"] for a in adds} == added
    assert all(a["dataChange"] is False for a in removes + adds)
    assert [a["txn"]["version"] for a in entry if "txn" in a] == [6], "the upper stays"
    info = next(a["commitInfo"] for a in entry if "commitInfo" in a)
    assert info["mvsink.reason"] == "compaction" and info["mvsink.since"] == 3
    assert (info["mvsink.lower"], info["mvsink.upper"], info["mvsink.view"]) == (6, 6, "c")

    assert view_upper(tgt, "c") == 6 and view_since(tgt, "c") == 3
    with pytest.raises(NotReadable):
        read_view(spark, tgt, "c", 2)
    assert Counter(tuple(r) for r in read_view(spark, tgt, "c", 4).collect()) == Counter(
        {(2, "bb"): 1, (4, "d"): 1})
    for again in (3, 2):
        assert compact(spark, shard, SCHEMA, again) == CompactionResult(3, None, 0, 0)
    assert DeltaTable(tgt).version() == result.version, "a compaction not above the since commits nothing"

    # Beyond the upper: times advance to upper - 1 only, the since is recorded as asked.
    result = compact(spark, shard, SCHEMA, 9)
    assert result.since == 9 and view_since(tgt, "c") == 9 and view_upper(tgt, "c") == 6
    assert _contents(spark, tgt, range(5, 6)) == {5: before[5]}
    assert _min_time(tgt) == 5
    latest = DeltaTable(tgt)
    versions = [h["version"] for h in newest_first(latest, first_chunk=2)]
    assert versions == list(range(latest.version(), -1, -1)), "history read in chunks"


def test_a_replica_reads_a_compaction_back_as_no_change(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b")])
    view = ViewDefinition("rb", tgt, ChangesInput(src), replica_id="r1", layout="updates")
    mv = MaterializedView(spark, view)
    assert mv.run_until_caught_up().upper == 1  # time 0: source version 1
    insert(spark, src, [(3, "c"), (1, "a2")])
    assert mv.run_until_caught_up().upper == 2  # time 1: source version 2
    assert [TimelineReader(view.timeline).version(t) for t in range(2)] == [1, 2]
    result = compact(spark, Shard(tgt, view.app_id, "rb", "compactor"), mv.schema, 1)
    assert result.files_removed >= 1 and result.files_added == 1

    report = mv.step()
    assert report.corrections == 0 and report.desc is None and not mv.pending_repairs
    assert report.minted_time is None, "a compaction is no drift: no repair time"
    assert DeltaTable(tgt).version() == result.version, "nothing to correct, nothing to repair"
    insert(spark, src, [(4, "d")])
    assert mv.run_until_caught_up().upper == 3
    latest = DeltaTable(tgt).history(1)[0]
    assert latest["mvsink.reason"] == "correction" and latest["mvsink.lower"] == 2
    assert sum(json.loads(a["add"]["stats"])["numRecords"]
               for a in _log_entry(tgt, latest["version"]) if "add" in a) == 1, "only the new row"
    assert Counter(tuple(r) for r in read_view(spark, tgt, "rb").collect()) == Counter(
        {(1, "a"): 1, (2, "b"): 1, (3, "c"): 1, (1, "a2"): 1, (4, "d"): 1})


def test_a_compaction_based_on_a_stale_snapshot_loses_and_starts_over(spark, tmp_path):
    history = HISTORY[:7]
    view, writer = _updates_table(tmp_path, "s", history)
    tgt = view.target
    compactor = Shard(tgt, view.app_id, "s", "compactor")
    late = [(1, "a", None, 4, -1), (4, "d", None, 4, 1)]
    # The append lands after the compactor read the table and staged, just before it commits.
    attempts = _before_first_commit(compactor, lambda: _append(writer, Description(4, 5), late))
    result = compact(spark, compactor, SCHEMA, 3)
    history = history + late

    assert [(lower, upper) for lower, upper, *_ in attempts] == [(4, 4), (5, 5)]
    assert result.since == 3 and result.version == DeltaTable(tgt).version()
    assert compactor.upper() == 5, "the stale attempt did not set the txn back"
    commits = [h for h in DeltaTable(tgt).history() if h.get("mvsink.reason") == "compaction"]
    assert [(h["mvsink.lower"], h["mvsink.upper"], h["version"]) for h in commits] == [(5, 5, result.version)]
    assert not list_files(tgt, "mvsink-s-3-4-compactor-"), "the lost attempt's staged files are deleted"
    assert list_files(tgt, "mvsink-s-3-5-compactor-"), "the retry staged for the new upper"
    assert list_files(tgt, "mvsink-") <= referenced_files(compactor)
    assert _contents(spark, tgt, range(3, 5)) == {t: _expected(history, t) for t in (3, 4)}
    assert _min_time(tgt) == 3


def test_the_since_never_goes_back_when_compactions_race(spark, tmp_path):
    view, _ = _updates_table(tmp_path, "r", [(t, f"v{t}", None, t, 1) for t in range(4)])
    tgt = view.target
    first, second = (Shard(tgt, view.app_id, "r", name) for name in ("first", "second"))
    # `second` plans a compaction to 2; `first` commits one to 3 before `second` commits.
    attempts = _before_first_commit(second, lambda: compact(spark, first, SCHEMA, 3))
    assert compact(spark, second, SCHEMA, 2) == CompactionResult(3, None, 0, 0)
    assert len(attempts) == 1, "the stale attempt lost, the next one found the since at 3"
    assert view_since(tgt, "r") == 3
    assert [h.get("mvsink.replica") for h in DeltaTable(tgt).history(1)] == ["first"]
    assert not list_files(tgt, "mvsink-r-2-4-second-"), "the lost attempt's staged files are deleted"
    assert _contents(spark, tgt, range(3, 4)) == {3: Counter({(t, f"v{t}", None): 1 for t in range(4)})}

    # Nothing left below the frontier (min(4, upper - 1) = 3): the commit only records the since.
    result = compact(spark, first, SCHEMA, 4)
    assert (result.since, result.version, result.files_removed, result.files_added) == (
        4, DeltaTable(tgt).version(), 0, 0) and view_since(tgt, "r") == 4


def test_a_foreign_optimize_meanwhile_makes_the_compaction_start_over(spark, tmp_path, monkeypatch):
    view, _ = _updates_table(tmp_path, "o", HISTORY)
    tgt = view.target
    real_stage, optimized = compaction.stage, []

    def stage_then_optimize(*args):
        staged = real_stage(*args)
        if not optimized:  # delta-rs would not see this rewrite (no data change) conflict
            optimized.append(DeltaTable(tgt).optimize.compact())
        return staged

    monkeypatch.setattr(compaction, "stage", stage_then_optimize)
    shard = Shard(tgt, view.app_id, "o", "compactor")
    result = compact(spark, shard, SCHEMA, 3)
    assert optimized and optimized[0]["numFilesRemoved"] == 6
    assert _contents(spark, tgt, range(3, 6)) == {t: _expected(HISTORY, t) for t in range(3, 6)}
    assert result.files_removed == 1, "started over on the optimized file"
    assert list_files(tgt, "mvsink-o-3-6-compactor-") <= referenced_files(shard), \
        "the lost attempt's files are deleted"
