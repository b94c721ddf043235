"""Where tables live: one place that turns a table URI into filesystem handles.

Local paths and ``file://`` URIs use the local filesystem; ``s3://``/``s3a://`` use S3 with the
standard AWS environment (credentials, region) and ``AWS_ENDPOINT_URL`` for S3-compatible stores.

Object stores fail transiently (500, 503, throttling, timeouts). Every client mvsink uses retries
a few times itself (delta-rs/object_store, pyarrow's AWS SDK, Hadoop S3A), with bounds set here;
on top of that, :func:`retrying` runs a whole operation again with bounded exponential backoff
(tenacity) when it still failed with a transient error. Settings (environment):

* ``MVSINK_S3_ATTEMPTS`` (default 6): attempts of one operation by :func:`retrying`;
* ``MVSINK_S3_MAX_BACKOFF`` (default 8): seconds, the longest wait between two attempts.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Callable, TypeVar

import pyarrow.fs as pafs
import tenacity

log = logging.getLogger(__name__)

T = TypeVar("T")


def is_s3(uri: str) -> bool:
    return uri.startswith(("s3://", "s3a://"))


def region() -> str:
    return os.environ.get("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path of ``uri`` inside it."""
    if is_s3(uri):
        bucket_and_key = uri.split("://", 1)[1]
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        fs = pafs.S3FileSystem(
            endpoint_override=endpoint,
            region=region(),
            scheme="http" if endpoint and endpoint.startswith("http://") else "https",
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=3),
            connect_timeout=10, request_timeout=60,
        )
        return fs, bucket_and_key
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    return pafs.LocalFileSystem(), uri


def delta_uri(uri: str) -> str:
    """The URI delta-rs understands for ``uri`` (s3a:// is Hadoop's spelling of s3://)."""
    return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri


def storage_options(uri: str) -> dict[str, str] | None:
    """delta-rs storage options for ``uri``: on S3, put-if-absent commits and bounded retries.

    delta-rs writes each log entry with a conditional PUT (``If-None-Match: *``), so two commits of
    one version cannot both land; ``conditional_put=etag`` names that mode explicitly. The
    object_store client retries a failed request a few times, at most ``retry_timeout`` long.
    """
    if not is_s3(uri):
        return None
    options = {
        "conditional_put": "etag",
        "max_retries": "3",
        "retry_timeout": "30s",
        "timeout": "60s",
        "connect_timeout": "10s",
    }
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint_url"] = endpoint
        options["allow_http"] = "true" if endpoint.startswith("http://") else "false"
    return options


def join(uri: str, name: str) -> str:
    return f"{uri.rstrip('/')}/{name}"


# -- transient failures ---------------------------------------------------------------------------

#: How transient failures read in the messages of delta-rs (object_store), pyarrow (AWS SDK) and
#: Spark (S3A): server errors, throttling, timeouts, broken connections.
_TRANSIENT = re.compile(
    r"\b(500|502|503|504)\b|internal server error|internal_?failure|internalerror|service.?unavailable"
    r"|slow.?down|throttl|timed? ?out|timeout|connection|error sending request|broken pipe"
    r"|reset by peer|temporarily|too many requests|request error|network",
    re.IGNORECASE,
)


_ANSI = re.compile(r"\x1b\[[0-9;]*m|↳")


def describe(exc: BaseException) -> str:
    """``exc``'s message on one line, without the terminal colours delta-rs puts in it."""
    return " ".join(_ANSI.sub(" ", str(exc)).split())


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an object store failure worth trying again (never a commit conflict)."""
    from deltalake.exceptions import (CommitFailedError, DeltaProtocolError, SchemaMismatchError,
                                      TableNotFoundError)

    if isinstance(exc, (CommitFailedError, DeltaProtocolError, SchemaMismatchError, TableNotFoundError,
                        FileNotFoundError, NotADirectoryError, PermissionError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return isinstance(exc, Exception) and _TRANSIENT.search(str(exc)) is not None


class StorageUnavailable(RuntimeError):
    """An object store operation still failed after all its retries."""


def attempts() -> int:
    return max(1, int(os.environ.get("MVSINK_S3_ATTEMPTS", "6")))


def backoff():
    """The wait between attempts: exponential from 0.2 s up to the max backoff, plus up to 0.2 s jitter."""
    longest = float(os.environ.get("MVSINK_S3_MAX_BACKOFF", "8"))
    return tenacity.wait_exponential(multiplier=0.2, min=0.2, max=longest) + tenacity.wait_random(0, 0.2)


def retrying(what: str, fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)``, run again on transient errors with bounded backoff.

    Raises :class:`StorageUnavailable` naming ``what`` once the attempts are used up; any other
    error is raised at once.
    """
    def before_sleep(state: tenacity.RetryCallState) -> None:
        log.warning("%s failed (attempt %d of %d), retrying: %s", what, state.attempt_number,
                    attempts(), describe(state.outcome.exception()))

    try:
        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_transient),
            stop=tenacity.stop_after_attempt(attempts()),
            wait=backoff(), before_sleep=before_sleep, reraise=False,
        ):
            with attempt:
                return fn(*args, **kwargs)
    except tenacity.RetryError as exc:
        last = exc.last_attempt.exception()
        raise StorageUnavailable(f"{what} failed after {attempts()} attempts: {describe(last)}") from last
    raise AssertionError("unreachable")
