"""A replica as a job: ``spark-submit mvsink_job.py --config view.yaml [--read-only] [--replica-id ID]``.

The job runs the view as a Structured Streaming query whose ``foreachBatch`` runs one sink step
per trigger. A read-only replica is told to allow writes by ``SIGUSR1`` or by the file given with
``--allow-writes-file`` appearing; either way it never goes back. ``SIGTERM``/``SIGINT`` stop the
query after the step in progress.

Exit codes: 0 stopped on request, 2 bad configuration (nothing written), 1 any other failure.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from mvsink.sink import MaterializedView
from mvsink.view import ConfigError, load_config

log = logging.getLogger("mvsink.replica")


class Control:
    """Operator requests that reach a running replica: allow writes, stop."""

    def __init__(self, allow_writes_file: str | None):
        self.allow_writes_file = allow_writes_file
        self.allow_writes_requested = threading.Event()
        self.stop_requested = threading.Event()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGUSR1, lambda *_: self.allow_writes_requested.set())
        signal.signal(signal.SIGTERM, lambda *_: self.stop_requested.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop_requested.set())

    def apply(self, view: MaterializedView) -> None:
        if self.allow_writes_file and os.path.exists(self.allow_writes_file):
            self.allow_writes_requested.set()
        if view.read_only and self.allow_writes_requested.is_set():
            view.allow_writes()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mvsink_job.py", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the view definition (YAML)")
    parser.add_argument("--read-only", action="store_true", default=None,
                        help="start read-only: compute and keep up, write nothing until allowed")
    parser.add_argument("--replica-id", help="this replica's name in commit metadata (default host-pid)")
    parser.add_argument("--allow-writes-file", help="allow writes once this file exists (or on SIGUSR1)")
    parser.add_argument("--trigger-seconds", type=float, default=2.0, help="seconds between steps")
    parser.add_argument("--orphan-grace-seconds", type=float, default=3600.0,
                        help="age after which unreferenced staged files are deleted")
    parser.add_argument("--log-level", default=os.environ.get("MVSINK_LOG_LEVEL", "INFO"))
    return parser.parse_args(argv)


def _stop_between_steps(query, timeout_seconds: float = 120.0) -> None:
    """Stop the query once no step is running (or after ``timeout_seconds``)."""
    deadline = time.monotonic() + timeout_seconds
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")
    control = Control(args.allow_writes_file)
    control.install_signal_handlers()
    try:
        view_def = load_config(args.config, read_only=args.read_only, replica_id=args.replica_id)
    except ConfigError as exc:
        log.error("bad configuration: %s", exc)
        return 2

    from mvsink.spark import spark_session

    spark = spark_session(f"mvsink-{view_def.view_id}-{view_def.replica_id}")
    try:
        view = MaterializedView(spark, view_def, orphan_grace_seconds=args.orphan_grace_seconds)
    except ConfigError as exc:
        log.error("bad configuration: %s", exc)
        return 2

    query = view.start_stream(args.trigger_seconds, before_step=lambda: control.apply(view))
    log.info("replica %s running view %s (query %s)", view_def.replica_id, view_def.view_id, query.id)
    while query.isActive and not control.stop_requested.is_set():
        time.sleep(0.2)
    if query.exception() is not None:
        log.error("the view's query failed: %s", query.exception())
        return 1
    _stop_between_steps(query)
    log.info("replica %s stopped", view_def.replica_id)
    return 0
