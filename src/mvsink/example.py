"""The built-in local example: two replicas keep one view exact while everything goes wrong.

``python mvsink_job.py --example [--workdir DIR] [--versions N]`` does, on the local disk:

1. creates a source Delta table of orders (change data feed on) and a view over it: the orders
   over 10 with a computed label (``order_row`` below), keyed by order id;
2. starts two replicas with ``spark-submit mvsink_job.py``: *blue* writes, *green* starts
   read-only;
3. changes the source version after version (inserts, updates, deletes);
4. a third of the way in, damages the target behind the replicas' backs (bogus rows appended at
   a future time, a Delta ``DELETE`` of a committed row);
5. two thirds of the way in, a blue/green cutover through the replica protocol (both replicas
   listen): once green has caught up, blue's view is dropped, green allowed to write, blue stopped;
6. waits for the view to catch up, stops green, and checks every committed version of the target
   against the view computed independently from the source, printing what it finds.
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
            stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT, env=env,
        )
        log.info("started replica %s (pid %d) on %s, log %s", name, self.proc.pid, self.address,
                 self.log_path)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        log.info("stopped replica %s", self.name)


def _change_source(spark, source: str, rng: random.Random, step: int, next_id: list[int]) -> str:
    op = rng.choice(["insert", "insert", "update", "delete"])
    if op == "insert":
        rows = ", ".join(
            f"({next_id[0] + i}, 'c{rng.randint(1, 5)}', {rng.randint(1, 150)})" for i in range(rng.randint(1, 5)))
        next_id[0] += 5
        spark.sql(f"INSERT INTO delta.`{source}` VALUES {rows}")
    elif op == "update":
        spark.sql(f"UPDATE delta.`{source}` SET amount = amount + 7 WHERE id % 4 = {step % 4}")
    else:
        spark.sql(f"DELETE FROM delta.`{source}` WHERE id % 9 = {step % 9}")
    return op


def _wait_upper(target: str, upper: int, timeout: float) -> None:
    from mvsink.read import view_upper

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(target) and view_upper(target, VIEW_ID) >= upper:
            return
        time.sleep(1)
    raise TimeoutError(f"the view did not reach upper {upper} in {timeout}s")


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
    source, target = str(workdir / "orders"), str(workdir / "big_orders")
    if args.check:
        return _check_cutover(source, target, args.check)

    from mvsink.spark import spark_session

    spark = spark_session("mvsink-example-driver")
    if args.change:
        rng = random.Random(time.time_ns())
        next_id = [(spark.sql(f"SELECT max(id) FROM delta.`{source}`").first()[0] or 0) + 1]
        for step in range(args.versions):
            log.info("source: %s", _change_source(spark, source, rng, step, next_id))
        return 0
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    spark.sql(f"CREATE TABLE delta.`{source}` (id BIGINT, customer STRING, amount BIGINT) USING delta "
              "TBLPROPERTIES (delta.enableChangeDataFeed = true, delta.enableDeletionVectors = false)")
    spark.sql(f"INSERT INTO delta.`{source}` VALUES (1, 'c1', 50), (2, 'c2', 5), (3, 'c3', 120)")
    config = workdir / "view.yaml"
    for path, function in ((config, "order_row"), (workdir / "view_v2.yaml", "order_row_v2")):
        path.write_text(yaml.safe_dump({
            "view_id": VIEW_ID, "target": target, "key": ["id"], "as_of": 1,
            "input": {"kind": "changes", "source": source, "map_row": f"mvsink.example:{function}",
                      "output_schema": "id BIGINT, customer STRING, amount BIGINT, label STRING"},
        }))
    if args.setup:
        print(f"source {source}, view definitions {config} and {workdir / 'view_v2.yaml'}")
        return 0
    blue = ExampleReplica("blue", config, workdir)
    green = ExampleReplica("green", config, workdir, "--read-only")
    rng = random.Random(7)
    next_id = [10]
    try:
        _wait_upper(target, 2, timeout=600)
        damage_at, cutover_at = args.versions // 3, 2 * args.versions // 3
        for step in range(args.versions):
            op = _change_source(spark, source, rng, step, next_id)
            log.info("source version %d: %s", step + 2, op)
            if step == damage_at:
                _damage(spark, target)
            if step == cutover_at:
                _cutover(blue, green)
            time.sleep(2)
        latest = spark.sql(f"DESCRIBE HISTORY delta.`{source}` LIMIT 1").first().version
        _wait_upper(target, latest + 1, timeout=600)
    finally:
        blue.stop()
        green.stop()
    return _report(source, target)


def _cutover(blue: ExampleReplica, green: ExampleReplica) -> None:
    """Through the replica protocol: wait for green to catch up, stop blue's view, let green write."""
    from mvsink.replica.controller import Controller, cutover

    with Controller(blue.address, timeout=600) as old, Controller(green.address, timeout=600) as new:
        old.connect()
        new.connect()
        frontier = cutover(old, new, VIEW_ID)
    log.info("cutover: green writes from frontier %d; stopping blue", frontier)
    blue.stop()


def _damage(spark, target: str) -> None:
    from mvsink.read import view_upper

    future = view_upper(target, VIEW_ID) + 3
    log.info("damage: appending bogus rows at future time %d, deleting order 1 from the table", future)
    spark.sql(f"INSERT INTO delta.`{target}` VALUES (999, 'mallory', 1, 'bogus', NULL, {future}, 1)")
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id = 1")


def _report(source: str, target: str) -> int:
    """Print each committed version's verdict; 0 if the table is right wherever it can be."""
    from mvsink.check import check_table, table_at

    result = check_table(target, VIEW_ID, COLUMNS, _expected(source), as_of=1)
    history = {int(h["version"]): h for h in table_at(target).history()}
    repairs = sorted((v, int(h["mvsink.lower"])) for v, h in history.items() if h.get("mvsink.reason") == "repair")
    foreign = sorted(v for v, h in history.items() if "mvsink.view" not in h and h.get("operation") != "CREATE TABLE")
    print("\n=== mvsink example: every committed version of the target against the view ===")
    wrong = []
    for version in sorted(history):
        h = history[version]
        who = h.get("mvsink.replica", f"foreign {h.get('operation')}")
        what = f"[{h['mvsink.lower']}, {h['mvsink.upper']}) {h['mvsink.reason']}" if "mvsink.view" in h else ""
        bad = result.bad_times.get(version, [])
        repaired_from = max((lower for v, lower in repairs if v <= version), default=None)
        damaged = bool(foreign) and version >= foreign[0]
        if not bad:
            verdict = "equals the view at every time below its upper"
        elif damaged and (repaired_from is None or max(bad) < repaired_from):
            verdict = f"equals the view except damaged history at times {bad[0]}..{bad[-1]}"
            verdict += "" if repaired_from is None else f" (repaired from time {repaired_from} on)"
        else:
            verdict = f"WRONG at times {bad}"
            wrong.append(version)
        print(f"version {version:3d}  {who:>22}  {what:28}  {verdict}")
    writers = {replica for _, _, _, replica in result.commits}
    print(f"\nforeign commits (the damage): {foreign}; repair commits (version, lower): {repairs}")
    print(f"writers: {sorted(writers)}; {result.versions_checked} versions and {result.times_checked} "
          "(version, time) pairs checked")
    ok = not wrong and bool(repairs) and {"blue", "green"} <= writers
    print("CHECK PASSED: the target equals the view at every committed version, except history damaged on "
          "purpose behind mvsink's back, repaired by the next batch" if ok else
          f"CHECK FAILED: wrong versions {wrong}, repairs {repairs}, writers {sorted(writers)}")
    return 0 if ok else 1


def _check_cutover(source: str, target: str, new_replica: str) -> int:
    """The target against view.yaml before ``new_replica``'s first commit, view_v2.yaml from it on."""
    from mvsink.check import check_table, expected_from_source, table_at

    commits = [h for h in reversed(table_at(target).history()) if h.get("mvsink.view") == VIEW_ID]
    first = next((h for h in commits if h.get("mvsink.replica") == new_replica), None)
    old, new = _expected(source), expected_from_source(source, COLUMNS, order_row_v2)
    if first is None:
        result = check_table(target, VIEW_ID, COLUMNS, old, as_of=1)
        print(f"no commit by {new_replica} yet; against view.yaml: {result.summary()}")
        return 0 if result.ok else 1
    switch_version, switch_time = first["version"], int(first["mvsink.lower"])
    before = check_table(target, VIEW_ID, COLUMNS, old, as_of=1)
    wrong_before = sorted(v for v in before.bad_times if v < switch_version)
    after = check_table(target, VIEW_ID, COLUMNS, lambda t: new(t) if t >= switch_time else old(t),
                        as_of=1, from_version=switch_version)
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


def _expected(source: str):
    from mvsink.check import expected_from_source

    return expected_from_source(source, COLUMNS, order_row)
