"""The daemon that forks Spark's Python workers (``spark.python.daemon.module``), with imports
from archives that do not reread those archives at every task.

Spark puts its archives on the Python workers' import path: ``pyspark.zip``, py4j's zip and the
``spark-core`` jar (``PythonUtils.sparkPythonPath``). Before every task a worker calls
``importlib.invalidate_caches()``, and on Python 3.11 a zip importer answers by reading its
archive's whole directory again, in Python: one importer per package imported from the zip
(``pyspark``, ``pyspark.sql``, ...) and per jar, about 25,000 entries, 0.15-0.3 s of each Python
task on this machine (a staging task writing 20,000 rows takes 0.01 s of Python of its own).

The archives also hold sources only, no compiled modules: every module a process imports from
them is compiled first, about 0.65 s for what a Python worker imports (pyspark, py4j, pyarrow's
use), paid by the daemon and again by each worker for what it imports after the fork. Where this
interpreter has the very same pyspark and py4j installed (pip's pyspark, as mvsink runs it), those
installed, compiled copies are imported instead: the archives go to the end of the import path.

This daemon is pyspark's own (:mod:`pyspark.daemon`), started after the zip importers are made
to keep the directory they read: Spark's archives do not change while a worker runs (a file added
with ``addPyFile`` is a new path, and its importer reads it when first used). Everything else a
worker does is pyspark's.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import zipfile
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


def prefer_installed_packages() -> None:
    """Move Spark's pyspark and py4j archives behind the installed packages on ``sys.path`` when
    the installed versions are the archives' own; otherwise (another pyspark, or none, as on a
    cluster's workers) leave the path as Spark made it."""
    archives = {p: v for p in sys.path if p.endswith(".zip") and (v := _archive_version(p)) is not None}
    if not archives or any(v != _installed_version(p) for p, v in archives.items()):
        return
    for path in archives:
        sys.path.remove(path)
        sys.path.append(path)


def _archive_version(path: str) -> str | None:
    """The version of the pyspark or py4j archive at ``path`` (None: not one of them)."""
    name = os.path.basename(path)
    if name == "pyspark.zip":
        try:
            with zipfile.ZipFile(path) as archive:
                source = archive.read("pyspark/version.py").decode()
        except (OSError, KeyError, zipfile.BadZipFile):
            return None
        found = re.search(r"""__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""", source)
        return found.group(1) if found else None
    found = re.fullmatch(r"py4j-(.+)-src\.zip", name)
    return found.group(1) if found else None


def _installed_version(path: str) -> str | None:
    try:
        return importlib.metadata.version("pyspark" if os.path.basename(path) == "pyspark.zip" else "py4j")
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    prefer_installed_packages()
    keep_archive_directories()
    from pyspark import daemon  # imports the worker module named in sys.argv, as Spark asks

    daemon.manager()
