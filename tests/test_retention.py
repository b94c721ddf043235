"""Retention: a writing replica keeps its table to the view's retain_history by itself, through the
CAS-safe compaction, and checkpoints the log; the view stays exact at every retained time."""

from __future__ import annotations

import os

import pytest
from deltalake import DeltaTable

from helpers import create_source, insert, write_config
from mvsink import ChangesInput, ConfigError, MaterializedView, ViewDefinition, load_config
from mvsink.append import retention
from mvsink.append.retention import Retention
from mvsink.check import check_table, expected_from_source
from mvsink.target.read import view_since


@pytest.mark.parametrize("value,parsed", [
    (None, Retention(seconds=3600)), ("30m", Retention(seconds=1800)), ("7d", Retention(seconds=7 * 86400)),
    (100, Retention(times=100)), ("12", Retention(times=12)), ("all", Retention()),
])
def test_retain_history_takes_a_duration_a_number_of_times_or_all(value, parsed):
    assert Retention.parse(value) == parsed


@pytest.mark.parametrize("value", ["1 fortnight", "1.5h", "", 0, -3, True, [1]])
def test_a_bad_retain_history_is_refused_naming_it(tmp_path, value):
    config = write_config(tmp_path / "view.yaml", view_id="v", target=str(tmp_path / "tgt"),
                          input={"kind": "changes", "source": str(tmp_path / "src")}, retain_history=value)
    with pytest.raises(ConfigError, match="view 'v': retain_history must"):
        load_config(config)


#: A low threshold, so that a short run compacts several times (the default is for long runs).
COMPACT_AFTER_FILES = 8


def test_a_stand_alone_writer_compacts_to_its_retention_and_checkpoints(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(retention, "COMPACT_AFTER_FILES", COMPACT_AFTER_FILES)
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, f"v{i}") for i in range(20)])
    view = ViewDefinition("kept", tgt, ChangesInput(src), key=("id",), replica_id="r1", retain_history=5,
                          layout="updates")  # retain_history: the update layout's; the table layout's compaction: test_table_layout
    mv = MaterializedView(spark, view)
    files = []
    for n in range(3 * COMPACT_AFTER_FILES + 4):
        insert(spark, src, [(100 + n, f"n{n}")])
        if n % 7 == 3:
            spark.sql(f"UPDATE delta.`{src}` SET v = concat(v, '+') WHERE id = {n % 20}")
        mv.run_until_caught_up()
        files.append(len(DeltaTable(tgt).file_uris()))
    upper = mv.shard.upper()
    assert mv.upkeep.compactions >= 2, f"compactions: {mv.upkeep.compactions}; files over the run: {files}"
    assert max(files) <= COMPACT_AFTER_FILES + 8, files
    assert view_since(tgt, "kept") >= upper - 5 - COMPACT_AFTER_FILES, "the since follows the retention"
    log = os.listdir(os.path.join(tgt, "_delta_log"))
    assert sum(name.endswith(".checkpoint.parquet") for name in log) >= 2, sorted(log)[-5:]
    assert any(name.endswith(".checkpoint.parquet") for name in os.listdir(view.timeline + "/_delta_log"))
    result = check_table(tgt, "kept", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=view.timeline))
    assert result.ok, result.problems[:5]
    assert result.times_checked > upper, "every retained time at every version"
