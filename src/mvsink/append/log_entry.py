"""Delta log entries mvsink writes itself: one version's actions, created only if absent.

delta-rs commits mvsink's appends (:mod:`mvsink.append`), but its actions cannot carry a deletion
vector (its Python ``AddAction``/``RemoveAction`` have no such field), and a ``remove`` that leaves
out the DV of the logical file it removes makes readers drop the wrong rows. So a commit that
marks rows deleted (:func:`mvsink.write.deletion_vectors.delete_rows`) is written here, as the
protocol defines a commit: the file ``_delta_log/<version, 20 digits>.json``, one JSON action per
line, ``commitInfo`` first. It is created only if no entry of that version exists:

* on a local filesystem the entry is written to a temporary file in the log directory and then
  hard-linked to its name: ``link`` fails if the name exists, so no entry is replaced and no
  reader sees a partial one; the temporary file is removed either way (one left by a writer
  killed in between is not a log entry: readers skip names that are not ``<digits>.json``);
* on S3 it is one ``PUT`` with ``If-None-Match: *``: S3 refuses it (412) where the key exists, and
  (409) while another conditional write of the key is in flight.

Of the writers of one version exactly one succeeds, as with delta-rs's put-if-absent.
:func:`commit_entry` reports a lost version (False) and never retries it: the caller reads the
log again and decides, as :func:`mvsink.append.compare_and_append` does for a delta-rs commit.
A transient failure is retried (:func:`mvsink.storage.retrying`). A retried ``PUT`` whose first
reply was lost may find its own entry and report False; the caller tells that from a lost race by
the commit's id in ``commitInfo`` (``mvsink.commit``), as it does for delta-rs.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

from mvsink import storage

#: ``commitInfo.engineInfo`` of the entries written here.
ENGINE_INFO = "mvsink"


def entry_uri(table_uri: str, version: int) -> str:
    """Where version ``version``'s log entry of the table at ``table_uri`` is."""
    return storage.join(table_uri, f"_delta_log/{version:020d}.json")


def txn_action(app_id: str, version: int, now_ms: int) -> dict[str, Any]:
    """The ``txn`` action that sets application ``app_id``'s transaction version (a view's upper)."""
    return {"txn": {"appId": app_id, "version": version, "lastUpdated": now_ms}}


def entry_bytes(actions: list[dict[str, Any]], commit_info: dict[str, Any]) -> bytes:
    """A log entry of ``actions`` (each ``{"<kind>": {...}}``) after its ``commitInfo`` (given
    fields, plus ``timestamp`` and ``engineInfo`` where not given)."""
    info = {"timestamp": int(time.time() * 1000), "engineInfo": ENGINE_INFO, **commit_info}
    return "".join(json.dumps(action, separators=(",", ":")) + "\n"
                   for action in [{"commitInfo": info}, *actions]).encode()


def commit_entry(table_uri: str, version: int, actions: list[dict[str, Any]],
                 commit_info: dict[str, Any]) -> bool:
    """Create version ``version`` of the table at ``table_uri`` holding ``actions``; False,
    writing nothing, if that version exists (or, on S3, is being written)."""
    body = entry_bytes(actions, commit_info)
    uri = entry_uri(table_uri, version)
    return storage.retrying(f"writing log entry {uri}", put_if_absent, uri, body)


def put_if_absent(uri: str, body: bytes) -> bool:
    """Create the file ``uri`` holding ``body`` if nothing is there (see the module doc); whether
    this call created it."""
    if storage.is_s3(uri):
        return _put_if_absent_s3(uri, body)
    path = uri.removeprefix("file://")
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    with open(temporary, "wb") as out:
        out.write(body)
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary)


def _put_if_absent_s3(uri: str, body: bytes) -> bool:
    from botocore.exceptions import ClientError

    bucket, key = uri.split("://", 1)[1].split("/", 1)
    try:
        _s3_client().put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
        return True
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict") \
                or error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
            return False
        raise


def _s3_client():
    """A boto3 S3 client for the standard AWS environment (``AWS_ENDPOINT_URL`` for S3-compatible
    stores), with the SDK's own retries bounded as :mod:`mvsink.storage` bounds the others'."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
                        region_name=storage.region(),
                        config=Config(retries={"max_attempts": 3, "mode": "standard"},
                                      connect_timeout=10, read_timeout=60))
