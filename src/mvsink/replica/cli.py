"""``mvsink``: the command line controller.

Each invocation connects to a replica, adopts its command history (so connecting changes
nothing: running views are kept as they are), sends one command and prints the answer::

    mvsink --replica HOST:PORT status
    mvsink --replica HOST:PORT create --config view.yaml
    mvsink --replica HOST:PORT allow-writes
    mvsink --replica HOST:PORT peek VIEW [--time T] [--where EXPR] [--columns a,b] [--limit N] [--offset N]
    mvsink --replica HOST:PORT compact VIEW --since T
    mvsink --replica HOST:PORT drop VIEW
    mvsink --replica HOST:PORT configure trigger_seconds=1 shuffle_partitions=4 log_level=DEBUG
    mvsink cutover --old HOST:PORT --new HOST:PORT VIEW

Exit codes: 0 done, 1 the replica refused or failed the command, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from mvsink.read import plain_sql
from mvsink.replica.controller import Controller, ControllerError, cutover
from mvsink.view import normalize_path

log = logging.getLogger("mvsink.cli")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mvsink", description="Drive mvsink replicas.")
    parser.add_argument("--replica", metavar="HOST:PORT", help="the replica to talk to")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for answers")
    parser.add_argument("--log-level", default="WARNING")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="views, frontiers, hydration, read-only or not")
    status.add_argument("--json", action="store_true", help="print the raw status as JSON")
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
    cut.add_argument("view")
    cut.add_argument("--old", required=True, metavar="HOST:PORT")
    cut.add_argument("--new", required=True, metavar="HOST:PORT")
    sql = commands.add_parser("sql", help="SQL that shows a view's rows to DuckDB, Spark or Trino "
                                          "without mvsink (reads the table, needs no replica)")
    sql.add_argument("target", help="the view's target table (path or s3:// URI)")
    sql.add_argument("--time", type=int, help="a time in [since, upper); default: the latest")
    sql.add_argument("--dialect", choices=["duckdb", "spark", "trino"], default="duckdb")
    sql.add_argument("--table", help="trino: the target's name in the Trino catalog")
    args = parser.parse_args(argv)
    if args.command not in ("cutover", "sql") and not args.replica:
        parser.error(f"{args.command} needs --replica HOST:PORT")
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
        print(f"  view {view_id}: {'hydrated' if view['hydrated'] else 'hydrating'}, frontier {frontier}, "
              f"since {view['since']}, {'running' if view['scheduled'] else 'not scheduled'}, "
              f"{view['steps']} steps" + (f", FAILED: {view['failed']}" if view["failed"] else ""))
    if not status.views:
        print("  no views")


def run(args: argparse.Namespace) -> None:
    if args.command == "sql":
        try:
            print(plain_sql(normalize_path(args.target), args.time, args.dialect, args.table))
        except ValueError as exc:
            raise SystemExit(f"mvsink sql: {exc}") from None
        return
    if args.command == "cutover":
        with Controller(args.old, timeout=args.timeout) as old, Controller(args.new, timeout=args.timeout) as new:
            old.connect()
            new.connect()
            frontier = cutover(old, new, args.view, timeout=args.timeout)
            print(f"cutover of {args.view}: {args.new} writes from frontier {frontier}; "
                  f"{args.old} has dropped the view (stop its process)")
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
    except ControllerError as exc:
        print(f"mvsink: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
