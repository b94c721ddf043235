"""Spark's Python workers start from :mod:`mvsink.worker_daemon`: they import the installed,
compiled pyspark and py4j where those are the versions of Spark's archives (else the archives,
as Spark asks), and their zip importers keep the archive directory they read."""

from __future__ import annotations

import sys
import zipfile

import py4j
import pyarrow as pa
import pyspark

from mvsink.worker_daemon import prefer_installed_packages


def test_python_workers_import_the_installed_pyspark_and_keep_archive_directories(spark):
    def imports_in_a_task(batches):  # defined here: shipped by value, not by this module's name
        import importlib
        import sys
        import zipimport

        for _ in batches:
            pass
        importlib.invalidate_caches()  # what every task does first; a no-op for the archives now
        import py4j
        import pyspark
        import pyspark.sql.avro.functions  # noqa: F401  (after the invalidation)

        kinds = {type(i).__name__ for i in sys.path_importer_cache.values() if isinstance(i, zipimport.zipimporter)}
        yield pa.RecordBatch.from_pydict({
            "kinds": [",".join(sorted(kinds))], "pyspark": [pyspark.__file__], "py4j": [py4j.__file__],
            "module": [sys.modules["pyspark.sql.avro.functions"].__file__]})

    assert spark.conf.get("spark.python.daemon.module") == "mvsink.worker_daemon"
    (row,) = spark.range(1).coalesce(1).mapInArrow(
        imports_in_a_task, "kinds string, pyspark string, py4j string, module string").collect()
    assert row.kinds in ("", "ArchiveImporter"), row.kinds  # the spark-core jar's, if it was consulted
    assert row.pyspark == pyspark.__file__ and ".zip" not in row.pyspark, row.pyspark
    assert row.py4j == py4j.__file__ and ".zip" not in row.py4j, row.py4j
    assert row.module.endswith("functions.py") and ".zip" not in row.module, row.module


def _archives(folder, pyspark_version: str) -> list[str]:
    """A py4j archive of the installed version and a pyspark archive of ``pyspark_version``."""
    folder.mkdir()
    with zipfile.ZipFile(folder / "pyspark.zip", "w") as out:
        out.writestr("pyspark/version.py", f'__version__: str = "{pyspark_version}"\n')
    zipfile.ZipFile(folder / f"py4j-{py4j.__version__}-src.zip", "w").close()
    return [str(folder / f"py4j-{py4j.__version__}-src.zip"), str(folder / "pyspark.zip")]


def test_archives_move_behind_the_installed_packages_only_when_their_versions_match(tmp_path, monkeypatch):
    installed = list(sys.path)  # where the installed distributions are found
    same = _archives(tmp_path / "same", pyspark.__version__)
    monkeypatch.setattr(sys, "path", [*same, *installed])
    prefer_installed_packages()
    assert sys.path == [*installed, *same]

    other = _archives(tmp_path / "other", "3.5.0")
    monkeypatch.setattr(sys, "path", [*other, *installed])
    prefer_installed_packages()
    assert sys.path == [*other, *installed]  # another pyspark: Spark's archives stay first
