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
