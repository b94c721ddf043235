"""The built-in local example: two replicas keep one view exact while everything goes wrong.

``python mvsink_job.py --example [--workdir DIR] [--versions N]`` does, on the local disk:

1. creates two source Delta tables, orders (change data feed on) and customers, and two views on
   one timeline over them: ``big_orders``, the orders over 10 with a computed label (``order_row``
   below, from the change feed), keyed by order id; and ``orders_with_customers``, orders joined
   with their customers in Spark SQL;
2. starts two replicas with ``spark-submit mvsink_job.py``: *blue* writes, *green* starts
   read-only; both run ``big_orders`` from its YAML and are given ``orders_with_customers``
   through the replica protocol;
3. changes the sources commit after commit (orders inserted, updated, deleted; customers moved);
4. a third of the way in, damages ``big_orders`` behind the replicas' backs (a bogus row appended,
   a Delta ``DELETE`` of a committed row);
5. two thirds of the way in, a blue/green cutover through the replica protocol (both replicas
   listen): once green has caught up, blue's views are dropped, green allowed to write, blue stopped;
6. waits for both views to catch up, stops green, and checks every version of both targets that
   mvsink committed (each a plain table of the view's rows, the default layout) against the views
   computed independently from the sources at the versions each time it holds stands for,
   printing what it finds.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

log = logging.getLogger("mvsink.example")

VIEW_ID = "big_orders"
COLUMNS = ["id", "customer", "amount", "label"]
JOIN_ID = "orders_with_customers"
JOIN_SQL = ("SELECT o.id, o.amount, c.name, c.segment FROM orders o JOIN customers c ON o.customer = c.id")
JOIN_COLUMNS = ["id", "amount", "name", "segment"]
SEGMENTS = ["retail", "wholesale", "online"]


def order_row(row: dict) -> dict | None:
    """The view's row function: keep orders over 10, label them."""
    if row["amount"] is None or row["amount"] <= 10:
        return None
    size = "large" if row["amount"] >= 100 else "medium"
    return {"id": row["id"], "customer": row["customer"], "amount": row["amount"],
            "label": f"{row['customer']}:{size}"}


def order_row_v2(row: dict) -> dict | None:
    """A changed definition (for the hand-run cutover in the README): orders over 20, new labels."""
    if row["amount"] is None or row["amount"] <= 20:
        return None
    size = "L" if row["amount"] >= 100 else "M"
    return {"id": row["id"], "customer": row["customer"], "amount": row["amount"],
            "label": f"{size}/{row['customer']}"}


def _spark_submit() -> list[str]:
    from mvsink.spark import delta_jars

    script = Path(sys.executable).parent / "spark-submit"
    return [str(script) if script.exists() else "spark-submit", "--master", "local[2]",
            "--conf", "spark.ui.enabled=false", "--jars", ",".join(delta_jars())]


class ExampleReplica:
    def __init__(self, name: str, config: Path, workdir: Path, *flags: str):
        job = Path(__file__).resolve().parents[2] / "mvsink_job.py"
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        self.name = name
        self.log_path = workdir / f"{name}.log"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.address = f"127.0.0.1:{sock.getsockname()[1]}"
        self.proc = subprocess.Popen(
            [*_spark_submit(), str(job), "--config", str(config), "--listen", self.address,
             "--replica-id", name, "--trigger-seconds", "1", *flags],
            stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        log.info("started replica %s (pid %d) on %s, log %s", name, self.proc.pid, self.address,
                 self.log_path)

    def stop(self) -> None:
        """SIGTERM to spark-submit (as ``kill $BLUE`` does); the job ends with it. Whatever of the
        replica's process group is left after that (nothing, normally) is killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        deadline = time.monotonic() + 10
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)  # the job ends by itself once spark-submit has
        if _group_alive(self.proc.pid):
            os.killpg(self.proc.pid, signal.SIGKILL)
        log.info("stopped replica %s", self.name)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _change_source(spark, source: str, rng: random.Random, step: int, next_id: list[int],
                   customers: str | None = None) -> str:
    """One commit: to the orders, or (with ``customers``) now and then to the customers."""
    op = rng.choice(["insert", "insert", "update", "delete"] + (["customer"] if customers else []))
    if op == "customer":
        spark.sql(f"UPDATE delta.`{customers}` SET segment = '{rng.choice(SEGMENTS)}' "
                  f"WHERE id = 'c{rng.randint(1, 5)}'")
    elif op == "insert":
        rows = ", ".join(
            f"({next_id[0] + i}, 'c{rng.randint(1, 5)}', {rng.randint(1, 150)})" for i in range(rng.randint(1, 5)))
        next_id[0] += 5
        spark.sql(f"INSERT INTO delta.`{source}` VALUES {rows}")
    elif op == "update":
        spark.sql(f"UPDATE delta.`{source}` SET amount = amount + 7 WHERE id % 4 = {step % 4}")
    else:
        spark.sql(f"DELETE FROM delta.`{source}` WHERE id % 9 = {step % 9}")
    return op


def _wait(what: str, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise TimeoutError(f"{what} did not happen in {timeout}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mvsink_job.py --example")
    parser.add_argument("--workdir", default="work-local/example")
    parser.add_argument("--versions", type=int, default=24, help="source versions to make")
    hand = parser.add_mutually_exclusive_group()
    hand.add_argument("--setup", action="store_true",
                      help="only create the source and two view definitions in --workdir (README cutover)")
    hand.add_argument("--change", action="store_true", help="only make --versions changes to the source")
    hand.add_argument("--check", metavar="REPLICA", help="only check the target; from REPLICA's first "
                      "commit on, against the changed definition (view_v2.yaml)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    workdir = Path(args.workdir).absolute()
    sources = {"orders": str(workdir / "orders"), "customers": str(workdir / "customers")}
    source, timeline = sources["orders"], str(workdir / "shop_timeline")
    target, join_target = str(workdir / VIEW_ID), str(workdir / JOIN_ID)
    if args.check:
        return _check_cutover(source, target, timeline, args.check)

    from mvsink.check import caught_up
    from mvsink.target.read import view_upper
    from mvsink.spark import spark_session

    spark = spark_session("mvsink-example-driver")
    if args.change:
        rng = random.Random(time.time_ns())
        next_id = [(spark.sql(f"SELECT max(id) FROM delta.`{source}`").first()[0] or 0) + 1]
        for step in range(args.versions):
            log.info("source: %s", _change_source(spark, source, rng, step, next_id, sources["customers"]))
        return 0
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    spark.sql(f"CREATE TABLE delta.`{source}` (id BIGINT, customer STRING, amount BIGINT) USING delta "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true, delta.enableDeletionVectors = false)")
    spark.sql(f"INSERT INTO delta.`{source}` VALUES (1, 'c1', 50), (2, 'c2', 5), (3, 'c3', 120)")
    spark.sql(f"CREATE TABLE delta.`{sources['customers']}` (id STRING, name STRING, segment STRING) USING delta")
    spark.sql(f"INSERT INTO delta.`{sources['customers']}` VALUES "
              + ", ".join(f"('c{i}', 'customer {i}', '{SEGMENTS[i % 3]}')" for i in range(1, 6)))
    config, join_config = workdir / "view.yaml", workdir / "join.yaml"
    shared = {"sources": sources, "timeline": timeline}
    for path, function in ((config, "order_row"), (workdir / "view_v2.yaml", "order_row_v2")):
        path.write_text(yaml.safe_dump({
            "view_id": VIEW_ID, "target": target, "key": ["id"], **shared,
            "input": {"kind": "changes", "source": "orders", "map_row": f"mvsink.example:{function}",
                      "output_schema": "id BIGINT, customer STRING, amount BIGINT, label STRING"},
        }))
    join_config.write_text(yaml.safe_dump({"view_id": JOIN_ID, "target": join_target, "key": ["id"], **shared,
                                           "input": {"kind": "snapshot", "sql": JOIN_SQL}}))
    if args.setup:
        print(f"sources {sources}, view definitions {config} and {workdir / 'view_v2.yaml'}")
        return 0
    blue = ExampleReplica("blue", config, workdir)
    green = ExampleReplica("green", config, workdir, "--read-only")
    rng = random.Random(7)
    next_id = [10]
    try:
        _wait("the first commit of big_orders", lambda: os.path.exists(target) and view_upper(target, VIEW_ID) > 0, timeout=600)
        _create_view(blue, green, join_config)
        damage_at, cutover_at = args.versions // 3, 2 * args.versions // 3
        for step in range(args.versions):
            op = _change_source(spark, source, rng, step, next_id, sources["customers"])
            log.info("source commit %d: %s", step + 1, op)
            if step == damage_at:
                _damage(spark, target)
            if step == cutover_at:
                _cutover(blue, green)
            time.sleep(2)
        for view_id, view_target in ((VIEW_ID, target), (JOIN_ID, join_target)):
            _wait(f"{view_id} catching up with the sources",
                  lambda: caught_up(view_target, view_id, timeline), timeout=600)
    finally:
        blue.stop()
        green.stop()
    return _report(sources, timeline, target, join_target)


def _create_view(blue: "ExampleReplica", green: "ExampleReplica", config: Path) -> None:
    """Give both replicas a second view on the same timeline, through the replica protocol."""
    from mvsink.replica.controller import Controller

    for replica in (blue, green):
        with Controller(replica.address, timeout=600) as ctl:
            ctl.connect()
            ctl.create_view(str(config))
        log.info("replica %s: created view %s from %s", replica.name, JOIN_ID, config)


def _cutover(blue: ExampleReplica, green: ExampleReplica) -> None:
    """Through the replica protocol, both views at once (allowing green to write promotes every
    view it runs): wait for green to catch up, drop the views at blue, let green write; then stop
    blue."""
    from mvsink.replica.controller import Controller, cutover, views_to_cut_over

    with Controller(blue.address, timeout=600) as old, Controller(green.address, timeout=600) as new:
        old.connect()
        new.connect()
        for view_id, frontier in cutover(old, new, views_to_cut_over(old, new, None)).items():
            log.info("cutover: green writes %s from frontier %d", view_id, frontier)
    log.info("cutover done; stopping blue")
    blue.stop()


def _damage(spark, target: str) -> None:
    from mvsink.target.read import view_upper

    log.info("damage: appending a bogus row, deleting order 1 from the table (upper %d)", view_upper(target, VIEW_ID))
    for statement in (f"INSERT INTO delta.`{target}` VALUES (999, 'mallory', 1, 'bogus')",
                      f"DELETE FROM delta.`{target}` WHERE id = 1"):
        for attempt in range(5):      # mvsink repairs at once: a DELETE may race with its commits
            try:
                spark.sql(statement)
                break
            except Exception as exc:
                if "DELTA_CONCURRENT" not in str(exc) or attempt == 4:
                    raise
                log.info("damage: %s lost a race with mvsink's commit; again", statement.split()[0])


def _report(sources: dict[str, str], timeline: str, target: str, join_target: str) -> int:
    """Print each committed version's verdict for both views; 0 if every version of each view is
    the view at every time it holds, the damage behind mvsink's back being no version of it."""
    ok_orders = _report_view(target, VIEW_ID, COLUMNS, _expected(sources["orders"], timeline), damaged=True)
    ok_join = _report_view(join_target, JOIN_ID, JOIN_COLUMNS, _expected_join(sources, timeline), damaged=False)
    ok = ok_orders and ok_join
    print("\nCHECK PASSED: every version of both targets that mvsink committed is its view at every "
          "time it holds; the damage behind mvsink's back was repaired by the next version, and "
          "every version before it still reads as the view" if ok else "\nCHECK FAILED (see above)")
    return 0 if ok else 1


def _report_view(target: str, view_id: str, columns: list[str], expected, damaged: bool) -> bool:
    from mvsink.check import check_table, table_at

    result = check_table(target, view_id, columns, expected)
    history = {int(h["version"]): h for h in table_at(target).history()}
    repairs = sorted(v for v, h in history.items() if h.get("mvsink.reason") == "repair")
    foreign = sorted(v for v, h in history.items() if "mvsink.view" not in h and h.get("operation") != "CREATE TABLE")
    print(f"\n=== {view_id}: every committed version of {target} against the view ===")
    wrong = []
    for version in sorted(history):
        h = history[version]
        who = h.get("mvsink.replica", f"foreign {h.get('operation')}")
        what = f"[{h['mvsink.lower']}, {h['mvsink.upper']}) {h['mvsink.reason']}" if "mvsink.view" in h else ""
        bad = result.bad_times.get(version, [])
        if version in result.foreign_versions:
            verdict = "not a version of the view (foreign, or committed on a foreign commit)"
        elif bad:
            verdict = f"WRONG at times {bad}"
            wrong.append(version)
        elif "mvsink.view" in h and h["mvsink.reason"] not in ("advance-upper",):
            verdict = "the view at every time it holds"
        else:
            verdict = ""
        print(f"version {version:3d}  {who:>22}  {what:28}  {verdict}")
    writers = {replica for _, _, _, replica in result.commits}
    print(f"foreign commits (the damage): {foreign}; repair commits: {repairs}")
    print(f"writers: {sorted(writers)}; {result.versions_checked} versions and {result.times_checked} "
          "(version, time) pairs checked")
    ok = not wrong and {"blue", "green"} <= writers and (bool(repairs) if damaged else not foreign)
    if not ok:
        print(f"{view_id}: wrong versions {wrong}, repairs {repairs}, writers {sorted(writers)}")
    return ok


def _check_cutover(source: str, target: str, timeline: str, new_replica: str) -> int:
    """The target against view.yaml before ``new_replica``'s first commit, view_v2.yaml from it on."""
    from mvsink.check import check_table, expected_from_source, table_at

    commits = [h for h in reversed(table_at(target).history()) if h.get("mvsink.view") == VIEW_ID]
    first = next((h for h in commits if h.get("mvsink.replica") == new_replica), None)
    old = _expected(source, timeline)
    new = expected_from_source(source, COLUMNS, order_row_v2, timeline=timeline, name="orders")
    if first is None:
        result = check_table(target, VIEW_ID, COLUMNS, old)
        print(f"no commit by {new_replica} yet; against view.yaml: {result.summary()}")
        return 0 if result.ok else 1
    switch_version, switch_time = first["version"], int(first["mvsink.lower"])
    before = check_table(target, VIEW_ID, COLUMNS, old)
    wrong_before = sorted(v for v in before.bad_times if v < switch_version)
    after = check_table(target, VIEW_ID, COLUMNS, lambda t: new(t) if t >= switch_time else old(t),
                        from_version=switch_version)
    writers = [(h["version"], h["mvsink.replica"], h["mvsink.reason"], int(h["mvsink.lower"]),
                int(h["mvsink.upper"])) for h in commits]
    for version, replica, reason, lower, upper in writers:
        print(f"version {version:3d}  {replica:>8}  [{lower}, {upper})  {reason}")
    print(f"{new_replica}'s first commit: version {switch_version}, time {switch_time}: from there on the "
          f"table holds view_v2.yaml; before it view.yaml")
    print(f"versions before: {'all correct' if not wrong_before else f'WRONG at {wrong_before}'}; "
          f"from the switch on: {after.summary()}")
    ok = not wrong_before and after.ok
    print("CUTOVER CHECK PASSED" if ok else "CUTOVER CHECK FAILED")
    return 0 if ok else 1


def _expected(source: str, timeline: str):
    from mvsink.check import expected_from_source

    return expected_from_source(source, COLUMNS, order_row, timeline=timeline, name="orders")


def _expected_join(sources: dict[str, str], timeline: str):
    """expected(t) of the join view, computed with delta-rs from the versions time t stands for."""
    from collections import Counter

    from mvsink.check import TimelineReader, source_rows

    reader = TimelineReader(timeline)

    def expected(t: int) -> Counter:
        versions = reader.versions(t)
        customers = {cid: (name, segment) for (cid, name, segment), n in
                     source_rows(sources["customers"], versions["customers"], ["id", "name", "segment"]).items()}
        out = Counter()
        for (oid, customer, amount), n in source_rows(sources["orders"], versions["orders"],
                                                      ["id", "customer", "amount"]).items():
            if customer in customers:
                out[(oid, amount, *customers[customer])] += n
        return out

    return expected
