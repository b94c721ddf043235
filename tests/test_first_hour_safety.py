"""What a user meets in the first hour, made safe: a target that is not the view's is refused with
nothing written (a Delta table mvsink did not write for the view, unless adopted; a folder of
other files; a regular file), and adopting a foreign table on request works."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from helpers import JOB, ROOT, create_source, insert, view_upper_of, wait_for, write_config
from mvsink import ChangesInput, MaterializedView, ViewDefinition, read_view
from mvsink.target.ownership import ForeignTarget, NotATarget
from mvsink.view import load_config

VIEW = "safe"


def _view(src: str, tgt: str, **settings) -> ViewDefinition:
    return ViewDefinition(VIEW, tgt, ChangesInput(src), key=("id",), replica_id="r1", **settings)


def _foreign_target(tgt: str) -> int:
    """A table with the view's columns holding someone's rows, made by delta-rs; its version."""
    write_deltalake(tgt, pa.table({"id": pa.array([1, 7], pa.int64()), "v": ["theirs", "theirs"]}))
    return DeltaTable(tgt).version()


def _tree(root) -> set[str]:
    """Every file and folder under ``root``, relative to it."""
    return {os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files}


def test_a_delta_table_the_view_did_not_write_is_refused_unless_adopted(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b")])
    version = _foreign_target(tgt)
    before = _tree(tmp_path)
    with pytest.raises(ForeignTarget) as refused:
        MaterializedView(spark, _view(src, tgt))
    message = str(refused.value)
    assert tgt in message and "adopt: true" in message and "--adopt-existing" in message, message
    assert DeltaTable(tgt).version() == version and _tree(tmp_path) == before, "nothing written"
    assert not os.path.exists(tgt + "_timeline")

    # Adopted on request (the YAML's adopt: true): the table becomes the view, their rows retracted.
    config = write_config(tmp_path / "view.yaml", view_id=VIEW, target=tgt, key=["id"], adopt=True,
                          input={"kind": "changes", "source": src})
    mv = MaterializedView(spark, load_config(config, replica_id="r1"))
    mv.run_until_caught_up()
    assert sorted(tuple(r) for r in read_view(spark, tgt, VIEW).collect()) == [(1, "a"), (2, "b")]
    # Written by the view now: a restart without adopt takes it as its own, and so does a replica.
    insert(spark, src, [(3, "c")])
    again = MaterializedView(spark, _view(src, tgt))
    again.run_until_caught_up()
    assert sorted(tuple(r) for r in read_view(spark, tgt, VIEW).collect()) == [(1, "a"), (2, "b"), (3, "c")]


def test_a_table_another_view_writes_is_refused(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    MaterializedView(spark, ViewDefinition("other", tgt, ChangesInput(src), key=("id",))).run_until_caught_up()
    version = DeltaTable(tgt).version()
    with pytest.raises(ForeignTarget, match="written by mvsink view other"):
        MaterializedView(spark, _view(src, tgt, timeline=str(tmp_path / "own_timeline")))
    assert DeltaTable(tgt).version() == version and not os.path.exists(tmp_path / "own_timeline")


def test_a_folder_of_other_files_and_a_regular_file_are_refused_before_anything_is_written(spark, tmp_path):
    src = str(tmp_path / "src")
    create_source(spark, src, [(1, "a")])
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "q3.csv").write_text("id,v\n1,x\n")
    file = tmp_path / "notes.parquet"
    file.write_bytes(b"not a table")
    before = _tree(tmp_path)
    with pytest.raises(NotATarget, match="no Delta table") as refused:
        MaterializedView(spark, _view(src, str(folder), adopt=True))  # adopt does not make it a table
    assert "q3.csv" in str(refused.value)
    with pytest.raises(NotATarget, match="is a file"):
        MaterializedView(spark, _view(src, str(file)))
    assert _tree(tmp_path) == before and file.read_bytes() == b"not a table", "nothing written"
    # An empty folder is a new target.
    empty = tmp_path / "empty"
    empty.mkdir()
    MaterializedView(spark, _view(src, str(empty))).run_until_caught_up()
    assert [tuple(r) for r in read_view(spark, str(empty), VIEW).collect()] == [(1, "a")]


def _job(config, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(JOB), "--config", str(config), *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_job_exits_2_on_a_target_that_is_not_the_views_and_adopts_with_adopt_existing(spark, tmp_path):
    src, tgt, file = str(tmp_path / "src"), str(tmp_path / "tgt"), tmp_path / "file"
    create_source(spark, src, [(1, "a")])
    version = _foreign_target(tgt)
    file.write_text("x")
    foreign = write_config(tmp_path / "foreign.yaml", view_id=VIEW, target=tgt, key=["id"],
                           input={"kind": "changes", "source": src})
    at_a_file = write_config(tmp_path / "file.yaml", view_id=VIEW, target=str(file), key=["id"],
                             input={"kind": "changes", "source": src})
    before = _tree(tmp_path)
    for config, named in ((foreign, "--adopt-existing"), (at_a_file, "is a file")):
        result = _job(config)
        assert result.returncode == 2, result.stderr[-2000:]
        assert "bad configuration" in result.stderr and named in result.stderr, result.stderr[-2000:]
        assert "hydrat" not in result.stderr, "refused before any hydration"
    assert _tree(tmp_path) == before and DeltaTable(tgt).version() == version, "nothing written"

    job = subprocess.Popen([sys.executable, str(JOB), "--config", str(foreign), "--adopt-existing",
                            "--trigger-seconds", "0.5"], cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (view_upper_of(tgt, VIEW) or 0) > 0 or job.poll() is not None, 300, what="the adopting job's commit")
        assert job.poll() is None, f"the job ended with {job.returncode}"
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=120)
    assert [tuple(r) for r in read_view(spark, tgt, VIEW).collect()] == [(1, "a")]


def test_a_pipeline_view_adopts_with_its_setting(spark, tmp_path):
    from mvsink.pipeline import load_pipeline

    src = str(tmp_path / "src")
    create_source(spark, src, [(1, "a")])
    folder = tmp_path / "pipe"
    folder.mkdir()
    (folder / "views.sql").write_text("CREATE MATERIALIZED VIEW kept AS SELECT id, v FROM orders;\n"
                                      "CREATE MATERIALIZED VIEW taken AS SELECT id, v FROM orders;\n")
    write_config(folder / "pipeline.yaml", sources={"orders": src}, targets="../out",
                 views={"taken": {"adopt": True}})
    specs = {s["view_id"]: s for s in load_pipeline(spark, folder).view_specs()}
    assert specs["taken"]["adopt"] is True and "adopt" not in specs["kept"]


def test_a_copy_of_a_pipeline_folder_with_relative_paths_cuts_over(spark, tmp_path):
    """``pipe2/`` copied from ``pipe/`` spells its sources ``.../pipe2/../data/orders``: the same
    tables as the timeline's ``.../pipe/../data/orders``, so its replicas start read-only on the
    timeline and, promoted, take the views over (the old writers fenced)."""
    import shutil

    from mvsink.append.fence import Fenced
    from mvsink.pipeline import load_pipeline
    from mvsink.view import view_from_spec

    data = tmp_path / "data"
    data.mkdir()
    src = str(data / "orders")
    create_source(spark, src, [(1, "a"), (2, "b")])
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "views.sql").write_text("CREATE MATERIALIZED VIEW orders_by_id KEY (id) AS SELECT id, v FROM orders;\n")
    write_config(pipe / "pipeline.yaml", sources={"orders": "../data/orders"}, targets="../out")

    def views(folder, read_only: bool, replica: str) -> list[MaterializedView]:
        return [MaterializedView(spark, view_from_spec(spec, read_only=read_only, replica_id=replica))
                for spec in load_pipeline(spark, folder).view_specs()]

    blue = views(pipe, False, "blue")
    for view in blue:
        view.run_until_caught_up()
    shutil.copytree(pipe, tmp_path / "pipe2")
    green = views(tmp_path / "pipe2", True, "green")  # refused before: "timeline ... is for sources"
    assert [v.view.sources["orders"] for v in green] == [str(tmp_path / "pipe2" / "../data/orders")]
    for view in green:
        view.step()
        view.allow_writes(cutover=True)
    insert(spark, src, [(3, "c")])
    for view in green:
        view.run_until_caught_up()
    target = green[0].view.target
    assert sorted(tuple(r) for r in read_view(spark, target, "orders_by_id").collect()) == [(1, "a"), (2, "b"), (3, "c")]
    with pytest.raises(Fenced):
        blue[0].step()
