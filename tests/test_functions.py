"""Functions named by file: two files of one name in different folders are two functions."""

from __future__ import annotations

from mvsink.view import resolve_function


def test_files_of_the_same_name_in_different_folders_each_give_their_function(tmp_path):
    for folder, body in (("a", "def f(x):\n    return 'a'\n"), ("b", "def g(x):\n    return 'b'\n")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "transform_same_name.py").write_text(body)
    assert resolve_function("transform_same_name.py:f", tmp_path / "a")(None) == "a"
    assert resolve_function("transform_same_name.py:g", tmp_path / "b")(None) == "b"
    assert resolve_function("transform_same_name.py:f", tmp_path / "a")(None) == "a"


def test_a_query_function_takes_only_the_sources_it_names(spark, tmp_path):
    from helpers import create_source, insert
    from mvsink import MaterializedView, SnapshotInput, ViewDefinition
    from mvsink.check import check_table, expected_from_source

    sources = {name: str(tmp_path / name) for name in ("orders", "customers", "lineitem")}
    for name, path in sources.items():
        create_source(spark, path, [(1, name)])

    def only_orders(orders):
        return orders

    timeline = str(tmp_path / "timeline")
    view = ViewDefinition("only_orders", str(tmp_path / "target"), SnapshotInput(query=only_orders), key=("id",),
                          sources=sources, timeline=timeline, replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    insert(spark, sources["orders"], [(2, "more")])
    insert(spark, sources["customers"], [(2, "other")])
    mv.run_until_caught_up()
    expected = expected_from_source(sources["orders"], ["id", "v"], timeline=timeline, name="orders")
    result = check_table(view.target, view.view_id, ["id", "v"], expected)
    assert result.ok and result.times_checked >= 2, result.problems
