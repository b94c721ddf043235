"""Spark's Python workers start from :mod:`mvsink.worker_daemon`: their zip importers keep the
archive directory they read, and still import what the archives hold."""

from __future__ import annotations

import pyarrow as pa


def test_python_workers_keep_archive_directories_and_still_import_from_them(spark):
    def importers_in_a_task(batches):  # defined here: shipped by value, not by this module's name
        import importlib
        import sys
        import zipimport

        for _ in batches:
            pass
        importlib.invalidate_caches()  # what every task does first; a no-op for the archives now
        import pyspark.sql.avro.functions  # noqa: F401  (from pyspark.zip, after the invalidation)

        kinds = {type(i).__name__ for i in sys.path_importer_cache.values() if isinstance(i, zipimport.zipimporter)}
        yield pa.RecordBatch.from_pydict({"kinds": [",".join(sorted(kinds))],
                                          "module": [sys.modules["pyspark.sql.avro.functions"].__file__]})

    assert spark.conf.get("spark.python.daemon.module") == "mvsink.worker_daemon"
    (row,) = spark.range(1).coalesce(1).mapInArrow(importers_in_a_task, "kinds string, module string").collect()
    assert row.kinds == "ArchiveImporter", row.kinds
    assert row.module.endswith("functions.py"), row.module
