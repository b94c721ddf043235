"""A Delta table as mvsink reads it without Spark: its latest version, its log entries, file URIs.

Every table mvsink touches (sources, the target, the timeline) is read here by listing and reading
its ``_delta_log`` directly: the newest version is the largest ``NNN.json`` commit file, a
version's actions are the lines of its commit file. This needs no Spark job and no snapshot load.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from urllib.parse import unquote

from pyarrow.fs import FileSelector

from mvsink import storage

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
#: A classic checkpoint's file: one part (``<version>.checkpoint.parquet``) or part i of n.
_CHECKPOINT_FILE = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
#: Fields of an add action that are maps (``to_pylist`` gives a map as a list of pairs).
_MAP_FIELDS = ("partitionValues", "tags")

#: Operations of foreign writers that never change a table's contents.
CONTENT_PRESERVING = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES", "CHECKPOINT",
                                "CREATE TABLE"})


def latest_version(table_uri: str) -> int | None:
    """The newest committed version of the Delta table at ``table_uri``; None if there is none."""
    fs, root = storage.filesystem(table_uri)
    try:
        infos = fs.get_file_info(FileSelector(storage.join(root, "_delta_log"), allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return None
    versions = [int(m.group(1)) for i in infos if (m := _COMMIT_FILE.match(i.base_name))]
    return max(versions) if versions else None


def log_actions(table_uri: str, version: int) -> list[dict]:
    """The actions of the commit file of ``version`` (one dict per line)."""
    fs, root = storage.filesystem(table_uri)
    with fs.open_input_stream(storage.join(root, f"_delta_log/{version:020d}.json")) as f:
        return [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]


class LogReplayError(RuntimeError):
    """A table's log cannot be replayed here (a checkpoint kind this reader does not know)."""


@functools.lru_cache(maxsize=16)
def live_files(table_uri: str, version: int) -> Mapping[str, dict]:
    """The add action of each logical file of the table's snapshot at ``version``, by path, as
    the log holds it (the JSON fields, ``deletionVector`` among them, which delta-rs's add actions
    leave out): the newest classic checkpoint at or below ``version`` (single- or multi-part), then
    the commits after it, each commit's removes before its adds (a file whose deletion vector
    changes is removed and added again in one commit). No Spark, no snapshot load. An add from a
    checkpoint has ``dataChange`` false, as checkpoints store it. A version's files never change,
    so the last few versions read are kept (a step's read-back, commit check and compaction read
    the same one), read-only."""
    fs, root = storage.filesystem(table_uri)
    log_dir = storage.join(root, "_delta_log")
    parts: dict[int, list[tuple[int, str]]] = {}
    for info in fs.get_file_info(FileSelector(log_dir, allow_not_found=True)):
        name = info.base_name
        if (m := _CHECKPOINT_FILE.match(name)) and int(m.group(1)) <= version:
            parts.setdefault(int(m.group(1)), []).append((int(m.group(3) or 1), info.path))
        elif ".checkpoint." in name and name.split(".")[0].isdigit() and int(name.split(".")[0]) <= version:
            raise LogReplayError(f"{table_uri}: {name} is a checkpoint kind mvsink does not read "
                                 "(a V2 checkpoint); the table's log cannot be replayed here")
    complete = [v for v, files in parts.items() if len(files) == files[0][0]]
    live: dict[str, dict] = {}
    since = -1
    if complete:
        since = max(complete)
        import pyarrow.parquet as pq

        for _, path in sorted(parts[since]):
            with fs.open_input_file(path) as f:
                for add in pq.read_table(f, columns=["add"]).column("add").to_pylist():
                    if add is not None:
                        live[add["path"]] = _as_logged(add)
    for each in range(since + 1, version + 1):
        actions = log_actions(table_uri, each)
        for action in actions:
            if "remove" in action:
                live.pop(action["remove"]["path"], None)
        for action in actions:
            if "add" in action:
                live[action["add"]["path"]] = action["add"]
    return MappingProxyType(live)


def _as_logged(add: dict) -> dict:
    """An add action read from a checkpoint's Parquet as its JSON form: no null fields, maps as
    objects, no ``*_parsed`` fields (the checkpoint's typed copies of ``stats`` and
    ``partitionValues``, not part of an action)."""
    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if v is not None}
        return value

    return {k: dict(v) if k in _MAP_FIELDS else clean(v) for k, v in add.items()
            if v is not None and not k.endswith("_parsed")}


def change_data_bytes(table_uri: str, first: int, last: int, most: int) -> int | None:
    """The bytes of the data files the change data feed of versions ``first`` to ``last`` reads:
    each commit's change data files, or, in a commit without them, its added and removed data
    files. None for more than ``most`` commits, when a commit file is gone (log cleanup), or when
    a file's size is not in the log (it is optional in a remove)."""
    if last - first + 1 > most:
        return None
    total = 0
    for version in range(first, last + 1):
        try:
            actions = log_actions(table_uri, version)
        except FileNotFoundError:
            return None
        files = [a["cdc"] for a in actions if "cdc" in a] or [
            f for a in actions for f in (a.get("add"), a.get("remove")) if f and f.get("dataChange", True)]
        if any("size" not in f for f in files):
            return None
        total += sum(f["size"] for f in files)
    return total


def commit_info(table_uri: str, version: int) -> dict:
    """The commit info of ``version`` (empty if it has none)."""
    for action in log_actions(table_uri, version):
        if "commitInfo" in action:
            return action["commitInfo"]
    return {}


def spark_uri(uri: str) -> str:
    """The URI Spark (Hadoop S3A) reads ``uri`` with."""
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri


def file_uri(table_uri: str, path: str) -> str:
    """The URI Spark reads a data file with, from its path in an add or remove action."""
    path = unquote(path)
    if "://" in path or path.startswith("/"):
        return path
    return spark_uri(storage.join(table_uri, path))
