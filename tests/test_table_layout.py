"""The table layout (the default): the target holds the view's rows; retractions rewrite only the
files that hold them; a batch computed against files that changed never lands; a version never
spans a time at which the view changes; error updates stay out of the rows; small files are
compacted; a layout is fixed with its table."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import mvsink.write as write_module
import mvsink.write.plain as plain
import mvsink.write.rewrite as rewrite
from helpers import create_source, foreign_append_before_commit, insert, log_history
from mvsink import (ChangesInput, ConfigError, MaterializedView, SnapshotInput, ViewDefinition, ViewInError,
                    read_view, view_errors)
from mvsink.append import retention
from mvsink.check import check_table, expected_from_source
from mvsink.target.read import NotReadable, version_of_time
from mvsink.table import latest_version, log_actions


def _rows(target: str, version: int | None = None) -> Counter:
    table = DeltaTable(target, version=version).to_pyarrow_table()
    return Counter(zip(*(table.column(c).to_pylist() for c in table.column_names)))


def test_a_retraction_rewrites_only_the_files_that_hold_its_rows(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, f"v{i}") for i in range(200)])
    view = ViewDefinition("keyed", tgt, ChangesInput(src), key=("id",), replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    insert(spark, src, [(i, f"n{i}") for i in range(1000, 1010)])  # a file of keys 1000..1009
    mv.run_until_caught_up()
    files_before = len(DeltaTable(tgt).file_uris())
    spark.sql(f"UPDATE delta.`{src}` SET v = 'changed' WHERE id = 1005")
    mv.run_until_caught_up()
    removed = [a for a in log_actions(tgt, latest_version(tgt)) if "remove" in a]
    assert len(removed) == 1, "only the file holding key 1005 is rewritten"
    # its survivors, with the new row folded into the rewrite: no file added
    assert len(DeltaTable(tgt).file_uris()) == files_before
    spark.sql(f"DELETE FROM delta.`{src}` WHERE id < 100 OR id = 1000")
    mv.run_until_caught_up()
    result = check_table(tgt, "keyed", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=view.timeline))
    assert result.ok, result.problems
    assert _rows(tgt)[(1005, "changed")] == 1 and sum(_rows(tgt).values()) == 109


def _ids_by_file(target: str) -> list[list]:
    """Each data file's ``id`` values, in the file's order, the files by their smallest id."""
    table = DeltaTable(target)
    files = [pq.read_table(uri, columns=["id"]).column("id").to_pylist() for uri in table.file_uris()]
    return sorted(files, key=lambda ids: (ids[0] is not None, ids[0]) if ids else (True, 0))


def test_the_files_hold_their_rows_in_key_order_and_an_insert_joins_the_file_of_its_range(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src)
    rows = [(i, f"v{i}") for i in random.Random(7).sample(range(0, 400, 2), 200)]  # one file, keys shuffled
    spark.createDataFrame(rows, "id BIGINT, v STRING").coalesce(1).write.format("delta").mode("append").save(src)
    view = ViewDefinition("sorted", tgt, ChangesInput(src), key=("id",), replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()                            # the first write: a Spark task's file
    insert(spark, src, [(i, f"v{i}") for i in random.Random(8).sample(range(400, 800, 2), 200)])
    mv.run_until_caught_up()                            # inserts only: the driver's file
    assert [(f[0], f[-1]) for f in _ids_by_file(tgt)] == [(0, 398), (400, 798)]
    # Both files hold an updated row, so both are rewritten; each new key joins the file of its range.
    spark.sql(f"UPDATE delta.`{src}` SET v = 'changed' WHERE id IN (10, 600)")
    insert(spark, src, [(501, "new"), (105, "new"), (101, "new"), (111, "new")])
    mv.run_until_caught_up()
    files = _ids_by_file(tgt)
    assert [(f[0], f[-1], len(f)) for f in files] == [(0, 398, 203), (400, 798, 201)]
    assert all(f == sorted(f) for f in files), "every file holds its rows in key order"
    result = check_table(tgt, "sorted", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=view.timeline))
    assert result.ok, result.problems


@pytest.mark.parametrize("staging", ["gathered", "gathered-in-tasks", "distributed"])
def test_duplicate_rows_are_retracted_copy_by_copy(spark, tmp_path, monkeypatch, staging):
    """Whether the batch's rewrites run in the driver (small files), in Spark tasks, or as a Spark join."""
    if staging == "distributed":
        monkeypatch.setattr(plain, "GATHERED_UPDATES", 0)
    if staging == "gathered-in-tasks":
        monkeypatch.setattr(rewrite, "DRIVER_REWRITE_BYTES", 0)
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (1, "a"), (1, "a"), (2, None), (2, None)])
    view = ViewDefinition("bag", tgt, SnapshotInput(sql="SELECT id, v FROM src"), sources={"src": src},
                          replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    insert(spark, src, [(1, "a")])
    mv.run_until_caught_up()
    spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 1")
    insert(spark, src, [(1, "a"), (3, "c")])
    mv.run_until_caught_up()
    assert _rows(tgt) == Counter({(1, "a"): 1, (2, None): 2, (3, "c"): 1})
    result = check_table(tgt, "bag", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=view.timeline))
    assert result.ok, result.problems


def test_rows_with_nulls_nans_and_nested_values_are_retracted(spark, tmp_path):
    """A retracted row is found by its whole value: nulls equal nulls, NaN equals NaN, arrays and
    structs by their contents, even where the prune column (here the first) tells no rows apart."""
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    schema = "g INT, x DOUBLE, tags ARRAY<STRING>, s STRUCT<a: INT, b: STRING>, id BIGINT"
    rows = [(i % 2, float("nan") if i % 3 == 0 else (None if i % 3 == 1 else i / 2),
             None if i % 4 == 0 else [f"t{i % 5}", None], None if i % 5 == 0 else (i % 7, None), i % 11)
            for i in range(120)]
    spark.createDataFrame(rows, schema).coalesce(3).write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(src)
    view = ViewDefinition("nested", tgt, SnapshotInput(sql="SELECT g, x, tags, s, id FROM src"),
                          sources={"src": src}, replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    spark.sql(f"DELETE FROM delta.`{src}` WHERE id IN (0, 3, 7)")
    mv.run_until_caught_up()
    spark.sql(f"UPDATE delta.`{src}` SET id = id + 100 WHERE g = 1 AND id IN (1, 4)")
    mv.run_until_caught_up()

    def bag(table):
        return Counter(repr(r) for r in table.to_pylist())
    expected = DeltaTable(src).to_pyarrow_table().select(["g", "x", "tags", "s", "id"])
    assert bag(DeltaTable(tgt).to_pyarrow_table().select(["g", "x", "tags", "s", "id"])) == bag(expected)


def test_a_batch_whose_files_were_deleted_meanwhile_is_stale_and_never_lands(spark, tmp_path, monkeypatch):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a"), (2, "b")])
    view = ViewDefinition("stale", tgt, ChangesInput(src), key=("id",), replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    spark.sql(f"UPDATE delta.`{src}` SET v = 'bb' WHERE id = 2")
    hit = write_module.failpoints.hit
    foreign = []

    def foreign_delete_first(name):
        if name == "after-stage" and not foreign:
            spark.sql(f"DELETE FROM delta.`{tgt}` WHERE id = 2")  # removes the file the batch rewrites
            foreign.append(latest_version(tgt))
        hit(name)

    monkeypatch.setattr(write_module.failpoints, "hit", foreign_delete_first)
    # The foreign DELETE lands after the batch was staged against the read-back's files.
    report = mv.step()
    while report.desc is None:
        report = mv.step()
    monkeypatch.undo()
    assert foreign and report.appended is False
    assert latest_version(tgt) == foreign[0], "nothing landed on the foreign DELETE"
    mv.run_until_caught_up()
    assert _rows(tgt) == Counter({(1, "a"): 1, (2, "bb"): 1})
    result = check_table(tgt, "stale", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=view.timeline))
    assert result.ok and result.foreign_versions == [foreign[0]], result.problems


def test_a_commit_on_an_unread_foreign_commit_is_not_a_version_of_the_view(spark, tmp_path, monkeypatch):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    view = ViewDefinition("race", tgt, ChangesInput(src), key=("id",), replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    insert(spark, src, [(2, "b")])
    landed = foreign_append_before_commit(monkeypatch, tgt, pa.table({"id": [99], "v": ["bogus"]}))
    report = mv.step()
    monkeypatch.undo()
    assert landed and report.appended
    damaged = latest_version(tgt)
    with pytest.raises(NotReadable, match=f"foreign commit.*{landed[0]}"):
        version_of_time(tgt, "race", report.desc.upper - 1)
    mv.run_until_caught_up()
    assert _rows(tgt) == Counter({(1, "a"): 1, (2, "b"): 1})
    result = check_table(tgt, "race", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=view.timeline))
    assert result.ok, result.problems
    assert result.foreign_versions == [landed[0], damaged]


def test_a_batch_never_spans_a_time_at_which_the_view_changes(spark, tmp_path):
    """A view catching up over several times (its timeline extended by another view) commits one
    version per time at which it changes, each the view at every time it holds."""
    src, tgt, other = str(tmp_path / "src"), str(tmp_path / "tgt"), str(tmp_path / "other")
    timeline = str(tmp_path / "timeline")
    create_source(spark, src, [(1, "a")])
    writer = MaterializedView(spark, ViewDefinition("writer", other, ChangesInput(src), sources={"src": src},
                                                    timeline=timeline, replica_id="r1"))
    late = ViewDefinition("late", tgt, ChangesInput(src), key=("id",), sources={"src": src}, timeline=timeline,
                          replica_id="r1")
    writer.run_until_caught_up()
    mv = MaterializedView(spark, late)
    mv.step()
    for edit in [lambda: insert(spark, src, [(2, "b")]), lambda: spark.sql(f"ALTER TABLE delta.`{src}` SET "
                 "TBLPROPERTIES ('x' = 'y')"), lambda: spark.sql(f"DELETE FROM delta.`{src}` WHERE id = 1")]:
        edit()
        writer.run_until_caught_up()
    for _ in range(6):
        mv.step()
    ranges = [(c["mvsink.lower"], c["mvsink.upper"]) for c in reversed(log_history(tgt))
              if c.get("mvsink.view") == "late" and c.get("mvsink.reason") != "advance-upper"]
    assert ranges[-2:] == [(1, 3), (3, 4)], "time 2 changes nothing, so one version holds times 1 and 2"
    result = check_table(tgt, "late", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=timeline))
    assert result.ok and result.times_checked == 4, result.problems


def parse(row: dict) -> dict | None:
    return {"id": row["id"], "n": int(row["v"])}


def test_error_updates_never_enter_the_rows(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "10"), (2, "x")])
    view = ViewDefinition("parsed", tgt, ChangesInput(src, map_row=parse, output_schema="id BIGINT, n INT"),
                          key=("id",), replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    assert _rows(tgt) == Counter({(1, 10): 1}), "the plain rows hold no error row"
    with pytest.raises(ViewInError, match="invalid literal"):
        read_view(spark, tgt, "parsed")
    assert {tuple(r) for r in read_view(spark, tgt, "parsed", errors="ignore").collect()} == {(1, 10)}
    insert(spark, src, [(1, "11")])                       # key 1 twice: a duplicate key
    mv.run_until_caught_up()
    errors = sorted(r[0] for r in view_errors(spark, tgt, mv.observed_upper - 1).collect())
    assert len(errors) == 2 and any("duplicate key" in e for e in errors), errors
    assert DeltaTable(tgt).to_pyarrow_table().column_names == ["id", "n"]
    spark.sql(f"DELETE FROM delta.`{src}` WHERE v IN ('x', '11')")
    mv.run_until_caught_up()
    assert {tuple(r) for r in read_view(spark, tgt, "parsed").collect()} == {(1, 10)}
    assert view_errors(spark, tgt, mv.observed_upper - 1).count() == 0
    with pytest.raises(ViewInError):
        read_view(spark, tgt, "parsed", time=0)         # the past keeps its errors


def test_small_files_are_compacted_through_the_commit_path(spark, tmp_path, monkeypatch):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(i, str(i)) for i in range(20)])
    view = ViewDefinition("small", tgt, ChangesInput(src, map_row=parse, output_schema="id BIGINT, n INT"),
                          key=("id",), replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    most = 0
    for step in range(24):
        if step % 3 == 0:
            insert(spark, src, [(1000 + step, "bad")])     # error updates come and stay
        elif step % 3 == 1:
            insert(spark, src, [(2000 + step, str(step))])  # a file of its own
        else:
            spark.sql(f"UPDATE delta.`{src}` SET v = '{100 + step}' WHERE id = {step % 20}")
        mv.run_until_caught_up()
        most = max(most, len(DeltaTable(tgt).file_uris()))
    assert mv.upkeep.compactions >= 2
    assert most <= retention.COMPACT_SMALL_FILES + 2, f"{most} files: compaction keeps the count bounded"
    assert len(mv.readback.error_files) <= retention.COMPACT_SMALL_FILES + 1, "error files folded"
    compactions = [c["version"] for c in log_history(tgt) if c.get("mvsink.reason") == "compaction"]
    assert all(not a[k]["dataChange"] for v in compactions for a in log_actions(tgt, v)
               for k in ("add", "remove") if k in a)
    assert view_errors(spark, tgt, mv.observed_upper - 1).count() == 8
    source = DeltaTable(src).to_pyarrow_table()
    assert _rows(tgt) == Counter((i, int(v)) for i, v in zip(source.column("id").to_pylist(),
                                                              source.column("v").to_pylist()) if v != "bad")
    assert all(ids == sorted(ids) for ids in _ids_by_file(tgt)), "compacted files keep the key order"


def test_a_layout_is_fixed_with_its_table(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    MaterializedView(spark, ViewDefinition("old", tgt, ChangesInput(src), replica_id="r1",
                                           layout="updates")).run_until_caught_up()
    version = latest_version(tgt)
    with pytest.raises(ConfigError, match="has the 'updates' layout, the view asks for 'table'.*new target"):
        MaterializedView(spark, ViewDefinition("old", tgt, ChangesInput(src), replica_id="r2", layout="table"))
    assert latest_version(tgt) == version, "nothing written"
    kept = MaterializedView(spark, ViewDefinition("old", tgt, ChangesInput(src), replica_id="r2"))
    assert kept.layout == "updates", "a view naming no layout keeps its table's"
    with pytest.raises(ConfigError, match="layout must be one of"):
        ViewDefinition("x", tgt, ChangesInput(src), layout="rows")
    with pytest.raises(ConfigError, match=r"says deletion_vectors: on, but its target .* does not allow them: "
                                          r"ALTER TABLE .* SET TBLPROPERTIES \(delta.enableDeletionVectors = true\)"):
        MaterializedView(spark, ViewDefinition("old", tgt, ChangesInput(src), replica_id="r3", deletion_vectors="on"))
    assert latest_version(tgt) == version, "nothing written"


def test_a_view_column_named_like_mvsinks_own_is_refused_before_anything_is_written(spark, tmp_path):
    src, tgt = str(tmp_path / "src"), str(tmp_path / "tgt")
    create_source(spark, src, [(1, "a")])
    view = ViewDefinition("clash", tgt, SnapshotInput(sql="SELECT id, v AS _MV_Diff FROM src"), sources={"src": src},
                          replica_id="r1")
    with pytest.raises(ConfigError, match=r"view columns \['_MV_Diff'\] clash with mvsink's reserved prefix _mv_"):
        MaterializedView(spark, view)
    assert latest_version(tgt) is None and latest_version(view.timeline) is None


@pytest.mark.parametrize("prune_values", ["one retraction each", "shared"])
def test_a_files_copies_of_retracted_rows_are_found_by_whole_row_null_safe_equality(prune_values):
    """The rewrite's search for retracted rows in one file (``rewrite._copies``: vectorized where
    each retraction has a prune value of its own, in Python otherwise) equals a plain search by
    Spark's ``<=>`` on every column, over random rows with repeats, nulls, NaN and -0.0."""
    import math
    import random

    from mvsink.write.rewrite import COPIES, _copies

    rng = random.Random(7 if prune_values == "shared" else 11)
    pick = lambda *choices: rng.choice(choices)  # noqa: E731
    stored = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("n", pa.int32())])
    file_rows = [(pick(None, *range(12)), pick(None, "a", "b"), pick(None, 0.0, -0.0, 1.5, math.nan), pick(None, 1, 2))
                 for _ in range(400)]
    candidates = list(dict.fromkeys(file_rows + [(3, "z", 9.0, 9), (None, "absent", None, None)]))
    rng.shuffle(candidates)
    if prune_values == "one retraction each":
        seen, retracted = set(), []
        for row in candidates:
            if row[0] not in seen:
                seen.add(row[0])
                retracted.append(row)
    else:
        retracted = candidates[:60]
    columns = list(zip(*file_rows))
    rows = pa.table({f.name: pa.array(c, f.type) for f, c in zip(stored, columns)})
    wanted = pa.table({f.name: pa.array([r[i] for r in retracted], f.type) for i, f in enumerate(stored)})
    wanted = wanted.append_column(COPIES, pa.array([1] * len(retracted), pa.int64()))

    def same(a, b):  # Spark's <=>: null equals null, NaN equals NaN, -0.0 equals 0.0
        return all(x is None and y is None or x is not None and y is not None and
                   (x == y or isinstance(x, float) and math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))

    expected = {r: [p for p, row in enumerate(file_rows) if same(row, want)] for r, want in enumerate(retracted)}
    expected = {r: ps for r, ps in expected.items() if ps}
    assert expected and any(len(ps) > 1 for ps in expected.values())  # the search has repeats to find
    assert _copies(rows, wanted, "id") == expected


def test_the_view_files_string_statistics_prune_only_where_they_are_plainly_values():
    """The files a retraction's values (``_prune_by_values``) or a key check's ranges
    (``files_in_ranges``) can be in, by the files' statistics of a string key, as Delta writes
    them: short keys; keys longer than the prefix Delta keeps (its maximum cut, a character after
    the prefix); keys with a character beyond the basic plane. The short keys' file is pruned by
    both bounds, the long keys' by its minimum alone, the third never."""
    from mvsink.write.rewrite import TableFile, _prune_by_values, files_in_ranges

    long = "m" * 40
    files = [TableFile("short", 1, "b1", "b2", 0), TableFile("long", 1, long[:32], long[:32] + "\uffff", 0),
             TableFile("astral", 1, "q\U0001F600", "q\U0001F601", 0)]
    for value, kept in [("b1", {"short", "astral"}), ("zz", {"long", "astral"}), ("a", {"astral"}),
                        (long + "q", {"long", "astral"}), (long[:32] + "\U0001F600", {"long", "astral"})]:
        assert {f.path for f in _prune_by_values(files, [value])} == kept, value
        assert {f.path for f in files_in_ranges(files, [(value, value)], False)} == kept, value
    assert {f.path for f in files_in_ranges(files, [("b2", long + "b")], False)} == {"short", "long", "astral"}
    assert {f.path for f in files_in_ranges(files, [("c", "d")], False)} == {"astral"}
    assert {f.path for f in _prune_by_values(files, [None])} == set(), "no file holds a null"
