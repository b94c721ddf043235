"""Where tables live: one place that turns a table URI into filesystem handles.

Local paths and ``file://`` URIs use the local filesystem; ``s3://``/``s3a://`` use S3 with the
standard AWS environment (credentials, region) and ``AWS_ENDPOINT_URL`` for S3-compatible stores.
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs


def is_s3(uri: str) -> bool:
    return uri.startswith(("s3://", "s3a://"))


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path of ``uri`` inside it."""
    if is_s3(uri):
        bucket_and_key = uri.split("://", 1)[1]
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        fs = pafs.S3FileSystem(
            endpoint_override=endpoint,
            region=os.environ.get("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1")),
            scheme="http" if endpoint and endpoint.startswith("http://") else "https",
        )
        return fs, bucket_and_key
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    return pafs.LocalFileSystem(), uri


def delta_uri(uri: str) -> str:
    """The URI delta-rs understands for ``uri`` (s3a:// is Hadoop's spelling of s3://)."""
    return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri


def storage_options(uri: str) -> dict[str, str] | None:
    """delta-rs storage options: conditional PUT for commits on S3, the endpoint override."""
    if not is_s3(uri):
        return None
    options = {"conditional_put": "etag"}
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint_url"] = endpoint
        options["allow_http"] = "true" if endpoint.startswith("http://") else "false"
    return options


def join(uri: str, name: str) -> str:
    return f"{uri.rstrip('/')}/{name}"
