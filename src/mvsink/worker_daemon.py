"""The daemon that forks Spark's Python workers (``spark.python.daemon.module``), with imports
from archives that do not reread those archives at every task.

Spark puts its archives on the Python workers' import path: ``pyspark.zip``, py4j's zip and the
``spark-core`` jar (``PythonUtils.sparkPythonPath``). Before every task a worker calls
``importlib.invalidate_caches()``, and on Python 3.11 a zip importer answers by reading its
archive's whole directory again, in Python: one importer per package imported from the zip
(``pyspark``, ``pyspark.sql``, ...) and per jar, about 25,000 entries, 0.15-0.3 s of each Python
task on this machine (a staging task writing 20,000 rows takes 0.01 s of Python of its own).

This daemon is pyspark's own (:mod:`pyspark.daemon`), started after the zip importers are made
to keep the directory they read: Spark's archives do not change while a worker runs (a file added
with ``addPyFile`` is a new path, and its importer reads it when first used). Everything else a
worker does is pyspark's.
"""

from __future__ import annotations

import sys
import zipimport


class ArchiveImporter(zipimport.zipimporter):
    """A zip importer whose directory, read once, stays: its archive does not change."""

    def invalidate_caches(self) -> None:
        pass


def keep_archive_directories() -> None:
    """Zip importers made from now on, and those already made, keep their directory."""
    sys.path_hooks[:] = [ArchiveImporter if hook is zipimport.zipimporter else hook for hook in sys.path_hooks]
    for importer in sys.path_importer_cache.values():
        if type(importer) is zipimport.zipimporter:
            importer.__class__ = ArchiveImporter


if __name__ == "__main__":
    keep_archive_directories()
    from pyspark import daemon  # imports the worker module named in sys.argv, as Spark asks

    daemon.manager()
