"""Cleanup of staged files that no commit references: left by a crash between write and append.

A replica that loses a race deletes its own staged files at once. A replica killed between staging
and committing cannot, so its files stay in the table directory, invisible to readers (no commit
adds them). This removes mvsink-staged files of the view that

* no commit in the log adds (neither the current snapshot nor any retained commit), and
* are older than a grace period, so that files another replica is staging right now are spared.

A table-layout view's error files (``_mv_errors/``) count as referenced while a commit's info in
the log lists them.

Never a file that a commit references: the referenced set is read after listing the directory,
so a file committed in between is seen as referenced.

The same on S3: pyarrow lists the table's prefix (object ``LastModified`` is the mtime), object
store calls are retried on transient errors, and a failed cleanup only logs: it is tried again
later and never fails a step.
"""

from __future__ import annotations

import json
import logging
import time

from pyarrow.fs import FileSelector, FileType

from mvsink import storage
from mvsink.append import Shard
from mvsink.target.layout import error_files
from mvsink.write import ERRORS_DIR, STAGED_PREFIX

log = logging.getLogger(__name__)


def referenced_files(shard: Shard) -> set[str]:
    """Every data file the log refers to: the snapshot's files and all retained adds/removes."""
    return storage.retrying(f"reading the log of {shard.target}", _referenced_files, shard)


def _referenced_files(shard: Shard) -> set[str]:
    table = shard.table()
    files = set(table.get_add_actions(flatten=True).column("path").to_pylist())
    fs, root = storage.filesystem(shard.target)
    log_dir = storage.join(root, "_delta_log")
    for info in fs.get_file_info(FileSelector(log_dir)):
        if not info.base_name.endswith(".json") or info.type != FileType.File:
            continue
        with fs.open_input_stream(info.path) as f:
            for line in f.read().decode().splitlines():
                action = json.loads(line) if line.strip() else {}
                for kind in ("add", "remove"):
                    if kind in action:
                        files.add(action[kind]["path"])
                if "commitInfo" in action:
                    files.update(error_files(action["commitInfo"]) or [])
    return files


def clean_orphans(shard: Shard, grace_seconds: float) -> int:
    """Delete this view's unreferenced staged files older than ``grace_seconds``; how many."""
    try:
        return _clean_orphans(shard, grace_seconds)
    except storage.StorageUnavailable as exc:
        log.warning("cleanup of %s skipped, the object store kept failing: %s", shard.target, exc)
        return 0


def _clean_orphans(shard: Shard, grace_seconds: float) -> int:
    fs, root = storage.filesystem(shard.target)
    prefix = f"{STAGED_PREFIX}{shard.view_id}-"
    try:
        infos = storage.retrying(f"listing {shard.target}", fs.get_file_info, FileSelector(root))
        infos = [(i, i.base_name) for i in infos]
        errors = storage.retrying(f"listing {shard.target}", fs.get_file_info,
                                  FileSelector(storage.join(root, ERRORS_DIR), allow_not_found=True))
        infos += [(i, f"{ERRORS_DIR}/{i.base_name}") for i in errors]
    except FileNotFoundError:
        return 0
    now = time.time()
    candidates = [
        (i, path) for i, path in infos
        if i.type == FileType.File and i.base_name.startswith(prefix)
        and i.mtime is not None and now - i.mtime.timestamp() > grace_seconds
    ]
    if not candidates:
        return 0
    referenced = referenced_files(shard)
    orphans = [i for i, path in candidates if path not in referenced]
    for info in orphans:
        try:
            storage.retrying(f"deleting orphan {info.base_name}", fs.delete_file, info.path)
        except FileNotFoundError:
            pass  # another replica cleaned it up
    if orphans:
        log.info("deleted %d orphaned staged files of view %s", len(orphans), shard.view_id)
    return len(orphans)
