"""A replica as a job: ``spark-submit mvsink_job.py [--config view.yaml | --pipeline DIR] [--listen HOST:PORT] [--read-only]``.

The job holds one :class:`~mvsink.replica.state.ComputeState` and drives it with protocol commands:

* ``--config view.yaml`` (stand-alone): the job issues its own commands: ``CreateTimely``,
  ``CreateInstance``, ``CreateDataflow`` and ``Schedule`` for the view, ``InitializationComplete``.
* ``--pipeline DIR`` (stand-alone): the same for every view of the pipeline
  (:mod:`mvsink.pipeline`), in dependency order, all in this job's one Spark session.
* ``--listen HOST:PORT``: a controller connects over gRPC and sends the commands
  (:mod:`mvsink.replica.server`). With ``--config`` as well, the view runs from the start and a
  controller that connects later reconciles with it.

Without ``--read-only`` the replica allows writes itself once initialized; with it, it computes
and writes nothing until ``AllowWrites`` (from a controller, ``SIGUSR1``, or the file given with
``--allow-writes-file`` appearing); it never goes back. Allowing writes that way is a cutover:
the view's first commit fences every other definition of it (:mod:`mvsink.append.fence`).
``SIGTERM``/``SIGINT`` (Ctrl-C) stop the views' queries between steps and end the job, logging
``stopping on SIGINT`` with the views. ``SIGUSR2`` writes every Python thread's stack to the log
(standard error) and changes nothing: what a job that seems stuck is doing.

Everything that needs no Spark (:mod:`mvsink.preflight`) is checked before Spark starts: a bad
file or flag costs no Spark start. A view whose steps fail (its source dropped a column it
reads, ...) stops alone, logged at ERROR and shown failed in its status and metrics; the job's
other views go on, and a stand-alone job ends (exit 1) once none runs.

Under ``spark-submit`` the job (the Python driver) is a child of the spark-submit JVM and needs
it: when that process ends, however it was stopped (``SIGTERM``, ``SIGKILL``), the job ends
too, at once, and its protocol port with it.

``--adopt-existing`` lets every view take over a target that is a Delta table it did not write
(:mod:`mvsink.target.ownership`); without it such a target is refused (exit 2).

Exit codes: 0 stopped on request (``SIGTERM``, ``SIGINT``), 2 bad configuration or flags (nothing
written; a target that is not the view's included), 3 fenced: another definition of the view writes
its target, this job's never will (:data:`EXIT_FENCED`), 1 every view failed, or any other failure.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
import time

from mvsink.metrics import MetricsServer
from mvsink.preflight import check_pipeline, check_view, positive_seconds
from mvsink.replica.protocol import (CreateDataflow, CreateInstance, CreateTimely,
                                     InitializationComplete, Schedule)
from mvsink.replica.state import ComputeState, LogConnection
from mvsink.view import ConfigError, default_replica_id, shared_spec, spec_from_yaml

log = logging.getLogger("mvsink.replica")

#: The exit code of a stand-alone job whose view is fenced (or refused at start) because another
#: definition of the view writes its target.
EXIT_FENCED = 3
#: The exit code of a job under spark-submit whose spark-submit process is gone.
EXIT_PARENT_GONE = 143
SPARK_LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mvsink_job.py", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="the view definition (YAML); the job runs it stand-alone")
    parser.add_argument("--pipeline", metavar="DIR",
                        help="a pipeline (folder of SQL files and pipeline.yaml); the job runs all its views")
    parser.add_argument("--listen", metavar="HOST:PORT", help="serve the replica protocol (gRPC) here")
    parser.add_argument("--read-only", action="store_true", default=None,
                        help="start read-only: compute and keep up, write nothing until allowed")
    parser.add_argument("--replica-id", help="this replica's name in commit metadata (default host-pid)")
    parser.add_argument("--adopt-existing", action="store_true",
                        help="take over targets that are existing Delta tables these views did not write "
                             "(their other rows are retracted); without it such a target is refused, exit 2")
    parser.add_argument("--allow-writes-file", help="allow writes once this file exists (or on SIGUSR1)")
    parser.add_argument("--trigger-seconds", type=positive_seconds,
                        help="seconds between steps, > 0 (default: the pipeline's trigger_seconds, else 2)")
    parser.add_argument("--orphan-grace-seconds", type=float, default=3600.0,
                        help="age after which unreferenced staged files are deleted")
    parser.add_argument("--log-level", default=os.environ.get("MVSINK_LOG_LEVEL", "INFO"), type=str.upper,
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="mvsink's log level (default INFO, or $MVSINK_LOG_LEVEL)")
    parser.add_argument("--spark-log-level", default=os.environ.get("MVSINK_SPARK_LOG_LEVEL", "WARN"),
                        choices=SPARK_LOG_LEVELS, type=str.upper,
                        help="Spark's log level once it runs (default WARN, or $MVSINK_SPARK_LOG_LEVEL)")
    parser.add_argument("--metrics-port", type=int,
                        help="serve Prometheus metrics at http://0.0.0.0:PORT/metrics (0: any free port)")
    example = parser.add_argument_group(
        "the built-in local example", "python mvsink_job.py --example [--workdir DIR] [--versions N] "
        "[--setup | --change | --check REPLICA] (README: Two commands, and the cutover by hand)")
    example.add_argument("--example", action="store_true",
                         help="run the example: sources, two replicas, damage, a blue/green cutover, a check")
    example.add_argument("--workdir", help="the example's folder (default work-local/example)")
    example.add_argument("--versions", help="source versions the example makes (default 24)")
    example.add_argument("--setup", action="store_true",
                         help="only create the example's sources and view definitions in --workdir")
    example.add_argument("--change", action="store_true", help="only make --versions changes to the sources")
    example.add_argument("--check", metavar="REPLICA",
                         help="only check the example's targets (from REPLICA's first commit: view_v2.yaml)")
    args = parser.parse_args(argv)
    if any(getattr(args, a) for a in ("workdir", "versions", "setup", "change", "check")):
        parser.error("--workdir, --versions, --setup, --change and --check go with --example")
    if args.config and args.pipeline:
        parser.error("give --config or --pipeline, not both")
    if not args.config and not args.pipeline and not args.listen:
        parser.error("give --config or --pipeline (stand-alone), --listen (controlled), or both")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--example" in argv:
        from mvsink.example import main as example_main

        return example_main([a for a in argv if a != "--example"])
    args = parse_args(argv)
    configure_logging(args.log_level)
    stop = threading.Event()
    stopped_by: list[str] = []
    allow_writes = threading.Event()

    def on_stop(signum, _frame) -> None:
        stopped_by.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGUSR1, lambda *_: allow_writes.set())
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    faulthandler.register(signal.SIGUSR2, all_threads=True)

    _end_with_spark_submit()
    spec = None
    metrics = None
    try:
        if args.config:
            spec = spec_from_yaml(args.config)
            check_view(spec)
        if args.pipeline:
            check_pipeline(args.pipeline)
        if args.metrics_port is not None:
            metrics = MetricsServer(args.metrics_port)  # bound now: a port in use stops us before Spark
    except ConfigError as exc:
        log.error("bad configuration: %s", exc)
        return 2
    read_only = args.read_only if args.read_only is not None else bool((spec or {}).get("read_only"))
    replica_id = args.replica_id or (spec or {}).get("replica_id") or default_replica_id()
    # The JVM starts now, before any gRPC thread: PySpark launches it with fork + preexec_fn,
    # which is not safe in a process whose other threads hold locks. CreateTimely adopts it.
    from mvsink.spark import spark_session

    if stop.is_set():
        return _stopped(stopped_by, [])
    spark = spark_session(f"mvsink-{replica_id}")
    spark.sparkContext.setLogLevel(args.spark_log_level)
    signal.signal(signal.SIGINT, on_stop)  # Spark's context replaced it with one raising KeyboardInterrupt
    trigger_seconds = args.trigger_seconds
    views = [shared_spec(spec)] if spec is not None else []
    if args.pipeline:
        from mvsink.pipeline import load_pipeline

        try:
            pipeline = load_pipeline(spark, args.pipeline)
        except ConfigError as exc:
            log.error("bad configuration: %s", exc)
            spark.stop()
            return 2
        views = pipeline.view_specs()
        trigger_seconds = trigger_seconds or pipeline.config.trigger_seconds
        log.info("pipeline %s: views %s", pipeline.config.path, ", ".join(v["view_id"] for v in views))
    if args.adopt_existing:
        views = [{**view, "adopt": True} for view in views]
    state = ComputeState(replica_id, lambda: spark, read_only_start=read_only,
                         trigger_seconds=trigger_seconds or 2.0, log_level=args.log_level)

    if views:
        own = LogConnection()
        state.connect(own)
        creates = [c for view in views for c in (CreateDataflow(view), Schedule(view["view_id"]))]
        for command in (CreateTimely(), CreateInstance(args.orphan_grace_seconds), *creates,
                        InitializationComplete()):
            state.handle(own, command)
        if own.errors:
            state.shutdown()
            message = own.errors[0].message
            return EXIT_FENCED if message.startswith("fenced") else 2 if message.startswith("bad configuration") else 1
    if metrics is not None:
        metrics.start(lambda: {view_id: running.view for view_id, running in list(state.views.items())})
    server = None
    if args.listen:
        from mvsink.replica.server import serve

        server = serve(state, args.listen)

    log.info("replica %s running%s", replica_id, f", listening on {args.listen}" if args.listen else "")
    exit_code = 0
    reported: set[str] = set()
    while not stop.is_set():
        if args.allow_writes_file and os.path.exists(args.allow_writes_file):
            allow_writes.set()
        if allow_writes.is_set() and state.read_only and state.instance is not None:
            state.allow_writes()
        fenced = state.fenced()
        if fenced and not args.listen:
            log.error("fenced, exiting with code %d: %s", EXIT_FENCED, fenced)
            exit_code = EXIT_FENCED
            break
        failures = state.failures()
        for view_id in sorted(set(failures) - reported):
            running = [v for v in state.views if v not in failures]
            log.error("view %s failed and stopped: %s%s", view_id, failures[view_id],
                      f"; views {', '.join(sorted(running))} go on" if running else "")
            reported.add(view_id)
        if failures and not args.listen and set(failures) >= set(state.views):
            log.error("every view failed: exiting with code 1")
            exit_code = 1
            break
        time.sleep(0.2)
    if stop.is_set():
        _stopped(stopped_by, sorted(state.views))
    if server is not None:
        server.stop(grace=2)
    if metrics is not None:
        metrics.stop()
    try:
        state.shutdown()
    except Exception as exc:  # e.g. SIGTERM to the whole group: Spark's JVM stopped first
        log.warning("stopping the views' queries failed (%s); Spark is gone already, nothing is lost",
                    str(exc).splitlines()[0][:200])
    log.info("replica %s stopped", replica_id)
    return exit_code


def configure_logging(level: str) -> None:
    """The job's log on standard error; a line about one view's step names it (:mod:`mvsink.log_context`)."""
    from mvsink.log_context import ViewFilter

    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(view)s%(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(ViewFilter())


def _stopped(stopped_by: list[str], views: list[str]) -> int:
    """Log why the job stops (a signal), and the views it stops; the exit code of a stop on request."""
    log.info("stopping on %s%s", stopped_by[0] if stopped_by else "request",
             f": views {', '.join(views)} stop between steps" if views else "")
    return 0


def _end_with_spark_submit() -> None:
    """Under spark-submit (its JVM is this process's parent, and Spark's gateway): end this
    process as soon as that parent is gone. Nothing is lost by ending at once: without its JVM
    the job can do nothing, and a commit cut short either landed or did not (like ``kill -9``).
    A job started by ``python mvsink_job.py`` owns its JVM and outlives its parent."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return
    # Polled, not prctl(PR_SET_PDEATHSIG): that signal comes when the JVM *thread* that started
    # this process ends, which need not be the JVM's end.
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        log.error("spark-submit (pid %d) is gone: the job ends with it", parent)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_PARENT_GONE)

    threading.Thread(target=watch, name="mvsink-parent-watch", daemon=True).start()
