"""``mvsink``: the command line controller.

Each invocation connects to a replica, adopts its command history (so connecting changes
nothing: running views are kept as they are), sends one command and prints the answer::

    mvsink --replica HOST:PORT status
    mvsink status --target PATH [--view ID] [--timeline PATH]     (any job, or none: reads the table)
    mvsink status --config view.yaml
    mvsink status --pipeline DIR                                  (every view of a pipeline, from its tables)
    mvsink explain --pipeline DIR [--mermaid]                     (a pipeline's views, dependencies, graph)
    mvsink explain view.yaml                                      (the strategy a view's changes get, and why)
    mvsink --replica HOST:PORT create --config view.yaml
    mvsink --replica HOST:PORT allow-writes
    mvsink --replica HOST:PORT peek VIEW [--time T] [--where EXPR] [--columns a,b] [--limit N] [--offset N]
    mvsink --replica HOST:PORT compact VIEW --since T
    mvsink --replica HOST:PORT drop VIEW
    mvsink --replica HOST:PORT plan VIEW [--limit N] [--json]
    mvsink --replica HOST:PORT configure trigger_seconds=1 shuffle_partitions=4 log_level=DEBUG
    mvsink cutover --old HOST:PORT --new HOST:PORT (VIEW | --all) [--max-plan-rows N]
                                                                  (--all: every view --new runs; a single
                                                                  view only if --new runs no other)
    mvsink sql TARGET [--time T] [--dialect duckdb|spark|trino]
    mvsink version TARGET --time T [--view ID]                    (the table version that holds time T)

Exit codes: 0 done, 1 the replica refused or failed the command (a cutover refused for its plan's
size included: nothing changed), the replica is not reachable (yet), or the table cannot be read as
a view's (``sql`` and ``version`` on a table no view wrote included); 2 bad arguments, or a view or
pipeline ``explain`` refuses (checked before Spark starts where no Spark is needed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys

from mvsink.target.read import NotReadable, newest_view, plain_sql, version_of_time
from mvsink.replica.controller import Controller, ControllerError, cutover, views_to_cut_over
from mvsink.replica.protocol import PlanResponse
from mvsink.target.status import table_status
from mvsink.view import ConfigError, normalize_path, spec_from_yaml, view_from_spec

log = logging.getLogger("mvsink.cli")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mvsink", description="Drive mvsink replicas.")
    parser.add_argument("--replica", metavar="HOST:PORT", help="the replica to talk to")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for answers")
    parser.add_argument("--log-level", default="WARNING")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="views, frontiers, hydration, read-only or not; with "
                                                "--target or --config: a view's state read from its table")
    status.add_argument("--json", action="store_true", help="print the raw status as JSON")
    status.add_argument("--target", help="read the view's state from this target table (no --replica)")
    status.add_argument("--config", help="read the state of this view definition's target (no --replica)")
    status.add_argument("--pipeline", help="read the state of every view of this pipeline (no --replica)")
    status.add_argument("--view", help="with --target: the view id (default: the table's newest writer)")
    status.add_argument("--timeline", help="with --target: the timeline (default <target>_timeline)")
    explain = commands.add_parser("explain", help="a view's strategy and why, or a pipeline's views, their "
                                                  "dependencies and a Mermaid graph (loads it as a job would: "
                                                  "also the check that it starts)")
    explain.add_argument("config", nargs="?", help="a view definition (view.yaml): the strategy its changes get")
    explain.add_argument("--pipeline", help="the pipeline's folder (or its pipeline.yaml)")
    explain.add_argument("--mermaid", action="store_true", help="print only the Mermaid graph")
    commands.add_parser("create", help="create and schedule a view").add_argument("--config", required=True)
    commands.add_parser("allow-writes", help="end read-only mode (for good)")
    peek = commands.add_parser("peek", help="a view's rows at a time")
    peek.add_argument("view")
    peek.add_argument("--time", type=int, help="default: the latest final time (frontier - 1)")
    peek.add_argument("--where", help="a Spark SQL filter")
    peek.add_argument("--columns", help="comma-separated projection")
    peek.add_argument("--limit", type=int)
    peek.add_argument("--offset", type=int, default=0)
    peek.add_argument("--max-bytes", type=int, default=64 * 1024 * 1024)
    compact = commands.add_parser("compact", help="advance a view's since and compact its table")
    compact.add_argument("view")
    compact.add_argument("--since", type=int, required=True)
    commands.add_parser("drop", help="drop a view at the replica (the table stays)").add_argument("view")
    configure = commands.add_parser("configure", help="change runtime settings")
    configure.add_argument("settings", nargs="+", metavar="NAME=VALUE")
    cut = commands.add_parser("cutover", help="blue/green: hand a view from --old to --new")
    cut.add_argument("view", nargs="?", help="the view; refused if --new runs other views too (use --all)")
    cut.add_argument("--all", action="store_true",
                     help="every view --new runs (a pipeline replica's): allowing writes promotes them all")
    cut.add_argument("--old", required=True, metavar="HOST:PORT")
    cut.add_argument("--new", required=True, metavar="HOST:PORT")
    cut.add_argument("--max-plan-rows", type=int, metavar="N",
                     help="refuse (exit 1, nothing changed) if the new replica's first commit writes more updates")
    plan = commands.add_parser("plan", help="the updates a view's next commit at the replica would write "
                                            "(a read-only replica's first commit once promoted)")
    plan.add_argument("view")
    plan.add_argument("--limit", type=int, default=100, help="updates to show (default 100; the counts are of all)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    sql = commands.add_parser("sql", help="SQL that shows a view's rows to DuckDB, Spark or Trino "
                                          "without mvsink (reads the table, needs no replica)")
    sql.add_argument("target", help="the view's target table (path or s3:// URI)")
    sql.add_argument("--time", type=int, help="a time in [since, upper); default: the latest")
    sql.add_argument("--dialect", choices=["duckdb", "spark", "trino"], default="duckdb")
    sql.add_argument("--table", help="trino: the target's name in the Trino catalog")
    version = commands.add_parser("version", help="the table version that holds a view's time (table "
                                                   "layout; read it with any engine's time travel)")
    version.add_argument("target", help="the view's target table (path or s3:// URI)")
    version.add_argument("--time", type=int, required=True, help="a time below the view's upper")
    version.add_argument("--view", help="the view's id (default: the writer of the table's newest commit)")
    args = parser.parse_args(argv)
    from_table = args.command == "status" and (args.target or args.config or args.pipeline)
    if args.command == "status" and sum(map(bool, (args.target, args.config, args.pipeline))) > 1:
        parser.error("status: give one of --target, --config and --pipeline")
    if args.command == "explain" and bool(args.config) == bool(args.pipeline):
        parser.error("explain: give a view.yaml or --pipeline DIR")
    if args.command == "explain" and args.mermaid and not args.pipeline:
        parser.error("explain: --mermaid goes with --pipeline")
    if args.command == "status" and (args.view or args.timeline) and not args.target:
        parser.error("status: --view and --timeline go with --target")
    if args.command not in ("cutover", "sql", "version", "explain") and not from_table and not args.replica:
        parser.error(f"{args.command} needs --replica HOST:PORT" + (
            " (or --target PATH / --config view.yaml)" if args.command == "status" else ""))
    if args.command == "cutover" and bool(args.view) == args.all:
        parser.error("cutover: give a VIEW or --all")
    if args.command == "plan" and args.limit < 0:
        parser.error("plan: --limit must be >= 0")
    return args


def _setting(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise SystemExit(f"mvsink: setting {text!r} must be NAME=VALUE")
    name, value = text.split("=", 1)
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def print_status(controller: Controller) -> None:
    status = controller.status()
    print(f"replica {status.replica_id}: {status.stage}, settings {status.config}")
    for view_id, view in sorted(status.views.items()):
        frontier = controller.frontiers.get(view_id, view["frontier"])
        print(f"  view {view_id}: {_hydration(view)}, frontier {frontier}, "
              f"since {view['since']}, {'running' if view['scheduled'] else 'not scheduled'}, "
              f"{view['steps']} steps" + (f", definition {view['definition']}" if view.get("definition") else "")
              + (f", FENCED: {view['fenced']}" if view.get("fenced") else "")
              + (f", FAILED: {view['failed']}" if view["failed"] and not view.get("fenced") else ""))
    if not status.views:
        print("  no views")


def print_plan(view_id: str, address: str, plan: PlanResponse, as_json: bool) -> None:
    table = plan.table()
    if as_json:
        print(json.dumps({"view_id": view_id, "replica": address, "lower": plan.lower, "upper": plan.upper,
                          "updates": plan.updates, "added": plan.added, "removed": plan.removed,
                          "rows": table.to_pylist()}, indent=2, sort_keys=True, default=str))
        return
    print(f"# plan of view {view_id} at {address}: its next commit writes [{plan.lower}, {plan.upper}): "
          f"{plan.updates} updates, +{plan.added} rows, -{plan.removed} rows")
    if not table.num_rows:
        print("(nothing to write: the table already holds this view)" if not plan.updates else "(rows not shown)")
        return
    frame = table.to_pandas()
    frame.insert(0, "+/-", ["+" if d > 0 else "-" for d in frame["_mv_diff"]])
    print(frame.to_string(index=False))
    if table.num_rows < plan.updates:
        print(f"# ... {plan.updates - table.num_rows} more updates (--limit)")


def print_table_status(status: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return
    print(f"view {status['view_id']} in {status['target']} ({status['layout']} layout, table version "
          f"{status['table_version']}): upper {status['upper']}, since {status['since']}; timeline "
          f"{status['timeline']}: upper {status['timeline_upper']}")
    if status["errors"]:
        print(f"  IN ERROR: {status['errors']} error rows, first: " + " | ".join(status["error_messages"]))
    for name, source in sorted(status["sources"].items()):
        print(f"  source {name}: latest version {source['latest_version']}, latest time covers "
              f"{source['covered_version']}, lag {source['lag_versions']} versions, {source['lag_seconds']:.1f}s")
    last = status["last_commit"]
    when = (f"{datetime.datetime.fromtimestamp(last['timestamp_ms'] / 1000, datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
            if last["timestamp_ms"] else "an unknown time")
    print(f"  last commit: version {last['version']} at {when} by {last['replica']}, "
          f"{last['reason']} [{last['lower']}, {last['upper']})"
          + (f", repairs versions {last['repairs']}" if last["repairs"] else "")
          + (f", definition {last['definition']}" if last.get("definition") else ""))
    if status.get("fence"):
        print(f"  fence: definition {status['fence']} writes the view")


def _hydration(view: dict) -> str:
    """How far the view's hydration is, from its status."""
    if view.get("hydrating"):
        started = datetime.datetime.fromtimestamp(view["hydration_started_at"], datetime.timezone.utc)
        tasks = view.get("hydration_tasks")
        return (f"hydrating since {started:%H:%M:%S} UTC ({view['hydration_seconds']:.0f}s"
                + (f", {tasks[0]}/{tasks[1]} tasks" if tasks and tasks[1] else "") + ")")
    if view["hydrated"]:
        return (f"hydrated ({view['hydration_rows']} updates to write, in {view['hydration_seconds']:.1f}s)"
                if view.get("hydration_seconds") else "hydrated")
    return "not hydrated yet"


def run(args: argparse.Namespace) -> None:
    if args.command == "explain" and args.config:
        from mvsink.desired.choose import explain as explain_view
        from mvsink.preflight import check_view
        from mvsink.spark import spark_session
        from mvsink.view import load_config

        check_view(spec_from_yaml(args.config))  # before Spark starts
        print(explain_view(spark_session("mvsink-explain"), load_config(args.config)))
        return
    if args.command == "explain":
        from mvsink.pipeline import load_pipeline
        from mvsink.pipeline.explain import explain
        from mvsink.preflight import check_pipeline
        from mvsink.spark import spark_session

        check_pipeline(args.pipeline)  # before Spark starts
        spark = spark_session("mvsink-explain")
        pipeline = load_pipeline(spark, args.pipeline)
        print(pipeline.graph.mermaid() if args.mermaid else explain(spark, pipeline))
        return
    if args.command == "status" and args.pipeline:
        from mvsink.pipeline import read_config
        from mvsink.pipeline.explain import pipeline_status

        states = pipeline_status(read_config(args.pipeline))
        if args.json:
            print(json.dumps(states, indent=2, sort_keys=True))
            return
        for view, state in states.items():
            if isinstance(state, str):
                print(f"view {view}: {state}")
            else:
                print_table_status(state, False)
        return
    if args.command == "status" and (args.target or args.config):
        if args.config:
            view = view_from_spec(spec_from_yaml(args.config), read_only=True)
            status = table_status(view.target, view.view_id, view.timeline)
        else:
            status = table_status(normalize_path(args.target), args.view,
                                  normalize_path(args.timeline) if args.timeline else None)
        print_table_status(status, args.json)
        return
    if args.command == "sql":
        try:
            print(plain_sql(normalize_path(args.target), args.time, args.dialect, args.table))
        except ValueError as exc:
            raise SystemExit(f"mvsink sql: {exc}") from None
        return
    if args.command == "version":
        target = normalize_path(args.target)
        try:
            view = args.view or newest_view(target)
            print(version_of_time(target, view, args.time))
        except NotReadable as exc:
            raise SystemExit(f"mvsink version: {exc}") from None
        return
    if args.command == "cutover":
        with Controller(args.old, timeout=args.timeout) as old, Controller(args.new, timeout=args.timeout) as new:
            old.connect()
            new.connect()
            views = views_to_cut_over(old, new, args.view)
            frontiers = cutover(old, new, views, timeout=args.timeout, max_plan_rows=args.max_plan_rows)
            left = sorted(set(old.status().views) - set(views))
            print(f"cutover of {len(views)} view{'s' if len(views) > 1 else ''} {', '.join(views)}: {args.new} "
                  + (f"writes from frontier {frontiers[views[0]]}" if len(views) == 1 else
                     "writes from frontiers " + ", ".join(f"{v} {f}" for v, f in frontiers.items()))
                  + f"; {args.old} has dropped {'them' if len(views) > 1 else 'it'}"
                  + (f" and still runs {', '.join(left)}" if left else " (stop its process)"))
        return
    with Controller(args.replica, timeout=args.timeout) as controller:
        controller.connect()
        if args.command == "status":
            if args.json:
                print(json.dumps(controller.status().__dict__, indent=2, sort_keys=True))
            else:
                print_status(controller)
        elif args.command == "create":
            view_id = controller.create_view(args.config)
            print(f"view {view_id} created and scheduled")
        elif args.command == "allow-writes":
            controller.allow_writes()
            print(f"{args.replica}: writes allowed")
        elif args.command == "peek":
            time = args.time
            if time is None:
                frontier = controller.status().views.get(args.view, {}).get("frontier")
                if frontier is None:
                    raise ControllerError(f"view {args.view} has no frontier yet; give --time")
                time = frontier - 1
            columns = args.columns.split(",") if args.columns else None
            table = controller.peek(args.view, time, filter=args.where, columns=columns,
                                    limit=args.limit, offset=args.offset, max_result_bytes=args.max_bytes)
            print(f"# view {args.view} at time {time}: {table.num_rows} rows")
            print(table.to_pandas().to_string(index=False) if table.num_rows else "(no rows)")
        elif args.command == "compact":
            controller.compact(args.view, args.since)
            print(f"view {args.view}: since advanced to {args.since}; the table is compacted at the next step")
        elif args.command == "plan":
            print_plan(args.view, args.replica, controller.plan(args.view, limit=args.limit), args.json)
        elif args.command == "drop":
            controller.drop(args.view)
            print(f"view {args.view} dropped at {args.replica}")
        elif args.command == "configure":
            settings = dict(_setting(s) for s in args.settings)
            controller.update_configuration(**settings)
            print(f"{args.replica}: settings updated: {settings}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        run(args)
    except (ControllerError, ConfigError) as exc:
        print(f"mvsink: {exc}", file=sys.stderr)
        return 2 if args.command == "explain" and isinstance(exc, ConfigError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
