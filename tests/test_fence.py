"""The definition id and the fence, without Spark: what makes two definitions the same, in separate
processes; the fence inside the compare-and-append of :mod:`mvsink.append`, on delta-rs alone."""

from __future__ import annotations

import logging

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from helpers import ROOT, write_config
from mvsink import failpoints
from mvsink.append import Shard, compare_and_append
from mvsink.target.commit_info import META_DEFINITION, REASON_FENCE
from mvsink.append.fence import DefinitionRefused, Fence, Fenced, fence_of, fence_property
from mvsink.mint import Description
from mvsink.write import StagedBatch, StagedFile

_ID_OF_CONFIG = textwrap.dedent("""
    import sys
    from pyspark.sql import types as T
    from mvsink.definition import definition_id
    from mvsink.view import load_config
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("label", T.StringType())])
    print(definition_id(load_config(sys.argv[1]), schema))
""")


def _id_in_a_process(config) -> str:
    out = subprocess.run([sys.executable, "-c", _ID_OF_CONFIG, str(config)], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return out.stdout.strip()


def test_one_definition_has_one_id_in_every_process_and_its_code_decides_it(tmp_path):
    functions = tmp_path / "functions.py"
    functions.write_text("def label(row):\n    return {'id': row['id'], 'label': 'x' + str(row['v'])}\n")
    base = dict(view_id="v", target=str(tmp_path / "tgt"), key=["id"],
                input={"kind": "changes", "source": str(tmp_path / "src"), "map_row": "functions.py:label",
                       "output_schema": "id BIGINT, label STRING"})
    config = write_config(tmp_path / "view.yaml", **base)
    first, second = _id_in_a_process(config), _id_in_a_process(config)
    assert first == second and len(first) == 16, "replicas of one definition agree on its id"
    # What does not decide the rows: the replica, read-only, retention, the timeline's path.
    other = write_config(tmp_path / "other.yaml", **base, replica_id="r9", read_only=True, retain_history="all",
                         timeline=str(tmp_path / "elsewhere"))
    assert _id_in_a_process(other) == first
    # The function's body, not only its name: same name, another body.
    functions.write_text("def label(row):\n    return {'id': row['id'], 'label': 'y' + str(row['v'])}\n")
    changed = _id_in_a_process(config)
    assert changed != first
    # The key, as_of and the sources decide it too.
    for setting in ({"key": ["label"]}, {"as_of": 3}, {"input": {**base["input"], "source": str(tmp_path / "s2")}}):
        assert _id_in_a_process(write_config(tmp_path / "x.yaml", **{**base, **setting})) != changed, setting


def test_sql_text_schema_and_functions_without_source(tmp_path):
    from pyspark.sql import types as T

    from mvsink.definition import definition_id, definition_parts
    from mvsink.view import SnapshotInput, ViewDefinition

    schema = T.StructType([T.StructField("id", T.LongType())])
    view = ViewDefinition("v", str(tmp_path / "t"), SnapshotInput(sql="SELECT id FROM s WHERE id > 2"),
                          sources={"s": str(tmp_path / "s")})
    same = ViewDefinition("v", str(tmp_path / "t"), SnapshotInput(sql="SELECT id FROM s WHERE id > 2"),
                          sources={"s": str(tmp_path / "s")}, replica_id="other")
    assert definition_id(view, schema) == definition_id(same, schema)
    stricter = ViewDefinition("v", str(tmp_path / "t"), SnapshotInput(sql="SELECT id FROM s WHERE id > 4"),
                              sources={"s": str(tmp_path / "s")})
    assert definition_id(stricter, schema) != definition_id(view, schema)
    wider = T.StructType([*schema.fields, T.StructField("extra", T.StringType())])
    assert definition_id(view, wider) != definition_id(view, schema), "the output schema counts"
    # A function with no source file (compiled from a string): its code object and closure count.
    made = {}
    for limit in (2, 2, 4):
        namespace = {}
        exec(compile(f"def make(n):\n    return lambda df: df.where(df.id > n)\nq = make({limit})",
                     "<typed>", "exec"), namespace)
        query_view = ViewDefinition("v", str(tmp_path / "t"), SnapshotInput(query=namespace["q"]),
                                    sources={"s": str(tmp_path / "s")})
        made.setdefault(limit, []).append(definition_id(query_view, schema))
        assert "code" in definition_parts(query_view, schema)["input"]["query"]
    assert made[2][0] == made[2][1] != made[4][0], made


# -- the fence in the compare-and-append ------------------------------------------------------------

_SCHEMA = pa.schema([("id", pa.int64()), ("_mv_time", pa.int64()), ("_mv_diff", pa.int64())])


def _shard(target: str, definition: str, replica: str, *, cutover: bool = False, read_only: bool = False) -> Shard:
    shard = Shard(target, "mvsink:v", "v", replica)
    shard.fence = Fence(target, "v", definition, replica)
    if not read_only:
        shard.fence.allow_writes(DeltaTable(target), cutover=cutover)
    return shard


def _commits(target: str) -> list[tuple[str, str, str]]:
    """(replica, reason, definition) of the view's commits, oldest first."""
    return [(h["mvsink.replica"], h["mvsink.reason"], h.get(META_DEFINITION))
            for h in reversed(DeltaTable(target).history()) if h.get("mvsink.view") == "v"]


@pytest.fixture
def blue_table(tmp_path):
    target = str(tmp_path / "tgt")
    DeltaTable.create(target, schema=_SCHEMA, configuration={fence_property("v"): "blue"},
                      raise_if_key_not_exists=False)
    blue = _shard(target, "blue", "b1")
    assert compare_and_append(blue, Description(0, 1), None, "progress").appended
    return target


def test_a_commit_staged_before_the_fence_is_raised_cannot_land_after(blue_table, monkeypatch):
    target = blue_table
    blue = _shard(target, "blue", "b1")
    green = _shard(target, "green", "g1", read_only=True)
    green.fence.allow_writes(DeltaTable(target), cutover=True)
    raised = []

    def green_goes_first(name: str) -> None:
        # Blue has read the table (upper 1, fence blue) and is about to commit [1, 2) on that
        # snapshot: green's first commit lands now, raising the fence without moving the upper.
        if name == "before-commit" and not raised:
            raised.append(green.raise_fence(green.table(), 1))

    monkeypatch.setattr(failpoints, "hit", green_goes_first)
    with pytest.raises(Fenced, match="is fenced"):
        compare_and_append(blue, Description(1, 2), None, "progress")
    assert raised and blue.fence.fenced
    assert fence_of(DeltaTable(target), "v") == "green"
    monkeypatch.undo()
    assert compare_and_append(green, Description(1, 2), None, "progress").appended
    with pytest.raises(Fenced):  # for good, whatever it tries
        compare_and_append(blue, Description(2, 3), None, "progress")
    commits = _commits(target)
    assert [c[0] for c in commits] == ["b1", "g1", "g1"], commits
    assert commits[1][1] == REASON_FENCE and {c[2] for c in commits[1:]} == {"green"}


def test_a_stale_snapshot_conflicts_and_the_reread_finds_the_fence(blue_table):
    target = blue_table
    blue = _shard(target, "blue", "b1")
    stale = blue.table()  # fence blue, upper 1
    green = _shard(target, "green", "g1", read_only=True)
    green.fence.allow_writes(DeltaTable(target), cutover=True)
    assert compare_and_append(green, Description(1, 2), None, "progress").appended
    from deltalake.exceptions import CommitFailedError

    with pytest.raises(CommitFailedError):  # Delta's own check: the snapshot is older than the fence
        blue.commit(stale, 1, 2, "progress")
    with pytest.raises(Fenced):
        blue.commit(blue.table(), 2, 3, "progress")
    # A second replica of green writes on; a new blue writer is refused at start, nothing written.
    green2 = _shard(target, "green", "g2")
    assert compare_and_append(green2, Description(2, 3), None, "progress").appended
    with pytest.raises(DefinitionRefused, match="definition green") as refused:
        _shard(target, "blue", "b2")
    assert "--read-only" in str(refused.value) and "blue" in str(refused.value)
    assert [c[0] for c in _commits(target)] == ["b1", "g1", "g1", "g2"]
    # A cutover back: blue started read-only and promoted takes the fence; green is fenced.
    back = _shard(target, "blue", "b3", read_only=True)
    back.fence.allow_writes(DeltaTable(target), cutover=True)
    assert compare_and_append(back, Description(3, 4), None, "progress").appended
    with pytest.raises(Fenced):
        compare_and_append(green2, Description(4, 5), None, "progress")
    assert fence_of(DeltaTable(target), "v") == "blue"


def _staged(target: str, desc: Description) -> StagedBatch:
    """One Parquet file written into the table's folder, not committed: a staged batch."""
    import pyarrow.parquet as pq

    name = f"staged-{desc.lower}.parquet"
    pq.write_table(pa.table({"id": [1], "_mv_time": [desc.lower], "_mv_diff": [1]}, schema=_SCHEMA),
                   f"{target}/{name}")
    size = (Path(target) / name).stat().st_size
    return StagedBatch(desc, target, files=[StagedFile(name, size, 1, "{}")])


def test_a_writer_that_loses_to_the_fence_deletes_its_staged_file(blue_table, monkeypatch):
    """As a lost race does: the fenced replica never commits, so its staged file is no one's."""
    target = blue_table
    blue = _shard(target, "blue", "b1")
    green = _shard(target, "green", "g1", read_only=True)
    green.fence.allow_writes(DeltaTable(target), cutover=True)
    monkeypatch.setattr(failpoints, "hit", lambda name: name == "before-commit" and green.raise_fence(green.table(), 1))
    batch = _staged(target, Description(1, 2))
    assert (Path(target) / batch.files[0].path).exists()
    with pytest.raises(Fenced, match="is fenced"):
        compare_and_append(blue, Description(1, 2), batch, "correction")
    assert not (Path(target) / batch.files[0].path).exists(), "the fenced writer's staged file is deleted"
    monkeypatch.undo()
    later = _staged(target, Description(1, 2))  # and once fenced, any later batch of it too
    with pytest.raises(Fenced):
        compare_and_append(blue, Description(1, 2), later, "correction")
    assert not (Path(target) / later.files[0].path).exists()
    assert [c[0] for c in _commits(target)] == ["b1", "g1"]


def test_the_fence_log_line_names_the_definition_it_replaced(blue_table, caplog):
    """``raised the fence ... (was X)``: X is the definition that held the fence before (read
    before the commit changes the snapshot), not the new one."""
    target = blue_table
    green = _shard(target, "green", "g1", read_only=True)
    green.fence.allow_writes(DeltaTable(target), cutover=True)
    with caplog.at_level(logging.WARNING, logger="mvsink.append"):
        green.raise_fence(green.table(), 1)
    raised = [r.getMessage() for r in caplog.records if "raised the fence" in r.getMessage()]
    assert len(raised) == 1 and raised[0].endswith("(was blue)"), raised
    assert "definition green raised" in raised[0], raised
