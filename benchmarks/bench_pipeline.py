"""A pipeline of ten views in one job against ten single-view jobs (today's way), on the same
sources and the same changes.

Workload: small TPC-H-like sources (``--orders`` orders, a tenth as many customers, 25 nations,
one to four line items an order), written with delta-rs; ten SQL views over them, four levels
deep: the six of the pipeline tests (``tests/pipeline_tpch.py``) and four more (``MORE``). The
sources are built once and copied, so each arm starts from the same tables; then ``--times``
rounds, one every ``--every`` seconds, each the same three source commits in both arms (new
orders and their line items, a status update; every third round a customer rename).

* pipeline: one ``python mvsink_job.py --pipeline DIR`` process (one JVM, one Spark session, the
  ten views);
* single-view jobs: ten ``python mvsink_job.py --config view.yaml`` processes, each its own JVM,
  each view the query the pipeline runs for it (its SQL with the views it reads as CTEs), all on
  one timeline of their own.

Both arms run one after the other, never at once. Per arm: the wall time and CPU from start until
every view is caught up (JVM start and hydration); then, per round, waiting until every view is
caught up: CPU seconds per time (user + system of the process trees: the Python drivers, their
JVMs and Spark's Python workers), peak resident memory (the trees' summed RSS, sampled every 0.5
s), and freshness: from the round's last source commit to the commit by which the last of the ten
views covers it (both Delta commit timestamps).

Run: ``python benchmarks/bench_pipeline.py [--orders 2000] [--times 4] [--every 20] [--trigger-seconds 2]``
(about 17 minutes on 2 busy cores; the ten jobs need some 13-16 GiB resident at their peak).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import yaml
from deltalake import DeltaTable, write_deltalake

from bench_sink import WORKDIR_HELP, machine, percentile, work_directory

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from pipeline_tpch import GOLD, SILVER  # noqa: E402  (the pipeline tests' six views)

from mvsink.target.commit_info import META_UPPER, META_VIEW  # noqa: E402
from mvsink.check import TimelineReader, caught_up  # noqa: E402
from mvsink.table import commit_info, latest_version  # noqa: E402

MORE = """CREATE MATERIALIZED VIEW order_totals KEY (l_orderkey) AS
SELECT l_orderkey, sum(l_extendedprice) AS total, count(*) AS lines FROM order_lines GROUP BY l_orderkey;

CREATE MATERIALIZED VIEW open_by_customer KEY (o_custkey) AS
SELECT o_custkey, sum(o_totalprice) AS open_value, count(*) AS open_orders FROM open_orders GROUP BY o_custkey;

CREATE MATERIALIZED VIEW customer_summary KEY (c_custkey) AS
SELECT cr.c_custkey, cr.n_name, cr.revenue, coalesce(ob.open_value, 0) AS open_value
FROM customer_revenue cr LEFT JOIN open_by_customer ob ON cr.c_custkey = ob.o_custkey;

-- the last view: level 3
CREATE MATERIALIZED VIEW nation_summary KEY (n_name) AS
SELECT n_name, count(*) AS customers, sum(revenue) AS revenue, sum(open_value) AS open_value
FROM customer_summary GROUP BY n_name
"""

SCHEMAS = {
    "nation": [("n_nationkey", pa.int64()), ("n_name", pa.string())],
    "customer": [("c_custkey", pa.int64()), ("c_name", pa.string()), ("c_nationkey", pa.int64())],
    "orders": [("o_orderkey", pa.int64()), ("o_custkey", pa.int64()), ("o_orderstatus", pa.string()),
               ("o_totalprice", pa.int64())],
    "lineitem": [("l_orderkey", pa.int64()), ("l_linenumber", pa.int64()), ("l_quantity", pa.int64()),
                 ("l_extendedprice", pa.int64()), ("l_returnflag", pa.string())],
}


def append(path: str, table: str, rows: list[tuple]) -> None:
    columns = list(zip(*rows))
    arrays = {name: pa.array(list(col), type=t) for (name, t), col in zip(SCHEMAS[table], columns)}
    write_deltalake(path, pa.table(arrays), mode="append")


def new_orders(rng: random.Random, first: int, count: int, customers: int) -> tuple[list[tuple], list[tuple]]:
    orders, lines = [], []
    for key in range(first, first + count):
        orders.append((key, rng.randint(1, customers), rng.choice("OF"), rng.randint(1, 900)))
        lines += [(key, j, rng.randint(1, 50), rng.randint(1, 1000), rng.choice("NRA"))
                  for j in range(1, rng.randint(2, 5))]
    return orders, lines


def build_sources(data: Path, orders: int) -> None:
    rng = random.Random(30)
    customers = max(10, orders // 10)
    sources = {name: str(data / name) for name in SCHEMAS}
    append(sources["nation"], "nation", [(i, f"N{i:02d}") for i in range(25)])
    append(sources["customer"], "customer", [(i, f"c{i}", rng.randrange(25)) for i in range(1, customers + 1)])
    rows, lines = new_orders(rng, 1, orders, customers)
    append(sources["orders"], "orders", rows)
    append(sources["lineitem"], "lineitem", lines)


def change(data: Path, round_: int, orders: int) -> None:
    """Round ``round_``'s source commits: the same in both arms."""
    rng = random.Random(1000 + round_)
    customers = max(10, orders // 10)
    rows, lines = new_orders(rng, orders + 1 + 10 * round_, 10, customers)
    append(str(data / "orders"), "orders", rows)
    append(str(data / "lineitem"), "lineitem", lines)
    if round_ % 3 == 2:
        DeltaTable(str(data / "customer")).update(predicate=f"c_custkey % 13 = {round_ % 13}",
                                                  updates={"c_name": "concat(c_name, '+')"})
    DeltaTable(str(data / "orders")).update(predicate=f"o_orderkey % 97 = {round_ % 97}",
                                            updates={"o_orderstatus": "'F'"})


def write_pipeline(folder: Path, data: Path, trigger: float) -> None:
    (folder / "sql").mkdir(parents=True)
    for name, text in (("silver", SILVER), ("gold", GOLD), ("more", MORE)):
        (folder / "sql" / f"{name}.sql").write_text(text)
    (folder / "pipeline.yaml").write_text(yaml.safe_dump({
        "sources": {name: str(data / name) for name in SCHEMAS}, "targets": str(folder / "views"),
        "defaults": {"trigger_seconds": trigger}}))


def view_specs(folder: Path) -> list[dict]:
    """The pipeline's view specifications, by mvsink's own loader (in a process of its own: a JVM)."""
    code = ("import json, sys; from mvsink.spark import spark_session; from mvsink.pipeline import load_pipeline; "
            "s = spark_session('bench-specs'); "
            "print('SPECS' + json.dumps(load_pipeline(s, sys.argv[1]).view_specs())); s.stop()")
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("SPECS"))[5:])


class Trees:
    """CPU seconds and resident memory of process trees, read from /proc."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _all(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        found, pending = [], list(self.pids)
        while pending:
            pid = pending.pop()
            found.append(pid)
            pending += children.get(pid, [])
        return found

    def cpu_seconds(self) -> float:
        """User + system time of every live process of the trees and of their reaped children."""
        ticks = 0
        for pid in self._all():
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        return ticks / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        pages = 0
        for pid in self._all():
            try:
                pages += int(open(f"/proc/{pid}/statm").read().split()[1])
            except (OSError, IndexError):
                continue
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self.peak_mib = max(self.peak_mib, self.rss_mib())

    def reset_peak(self) -> None:
        self.peak_mib = self.rss_mib()

    def stop(self) -> None:
        self._stop.set()


def run_arm(name: str, commands: list[list[str]], views: dict[str, str], timeline: str, data: Path,
            args, logs: Path) -> dict:
    """Start ``commands``, wait for the ``views`` (view -> target) to hydrate, run the rounds."""
    started = time.monotonic()
    processes = [subprocess.Popen(c, stdout=open(logs / f"{name}-{i}.log", "w"), stderr=subprocess.STDOUT,
                                  cwd=ROOT) for i, c in enumerate(commands)]
    trees = Trees([p.pid for p in processes])

    def wait_caught_up(limit: float) -> None:
        deadline = time.monotonic() + limit
        while not all(caught_up(target, view, timeline) for view, target in views.items()):
            if any(p.poll() is not None for p in processes):
                raise RuntimeError(f"{name}: a job ended (exit {[p.poll() for p in processes]}); see {logs}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: not caught up after {limit:.0f}s; see {logs}")
            time.sleep(0.25)

    try:
        wait_caught_up(900)
        result = {"start_wall": time.monotonic() - started, "start_cpu": trees.cpu_seconds(),
                  "start_peak": trees.peak_mib}
        trees.reset_peak()
        cpu0, rounds = trees.cpu_seconds(), []
        for r in range(args.times):
            began = time.monotonic()
            change(data, r, args.orders)
            after = {s: latest_version(str(data / s)) for s in SCHEMAS}
            last_commit = max(commit_info(str(data / s), v)["timestamp"] for s, v in after.items())
            wait_caught_up(600)
            rounds.append((after, last_commit))
            print(f"{name}: round {r + 1} of {args.times} caught up in {time.monotonic() - began:.1f}s", flush=True)
            time.sleep(max(0.0, args.every - (time.monotonic() - began)))
        result.update(cpu_per_time=(trees.cpu_seconds() - cpu0) / args.times, peak=trees.peak_mib,
                      freshness=freshness(views, timeline, rounds))
    finally:
        trees.stop()
        for p in processes:
            p.send_signal(signal.SIGTERM)
        for p in processes:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    return result


def freshness(views: dict[str, str], timeline: str, rounds: list[tuple[dict, int]]) -> list[float]:
    """Per round: seconds from its last source commit to the commit by which the last view has a
    time covering every source's version after the round."""
    reader = TimelineReader(timeline)
    covered: dict[str, list[tuple[int, int]]] = {}   # view -> (upper, timestamp) of its commits
    for view, target in views.items():
        covered[view] = [(int(info[META_UPPER]), info["timestamp"])
                         for info in (commit_info(target, v) for v in range(latest_version(target) + 1))
                         if info.get(META_VIEW) == view and META_UPPER in info]
    seconds = []
    for after, committed in rounds:
        t = 0
        while any(reader.versions(t)[s] < v for s, v in after.items()):
            t += 1
        last = max(min(ts for upper, ts in covered[view] if upper > t) for view in views)
        seconds.append((last - committed) / 1000)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=int, default=2000, help="orders in the sources (customers: a tenth)")
    parser.add_argument("--times", type=int, default=4, help="rounds of source changes per arm")
    parser.add_argument("--every", type=float, default=20.0, help="seconds between rounds")
    parser.add_argument("--trigger-seconds", type=float, default=2.0)
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    args = parser.parse_args()
    with work_directory(args.workdir, "pipeline") as workdir:
        return run(args, Path(workdir))


def run(args, workdir: Path) -> int:
    load_before = os.getloadavg()
    print(f"building the sources ({args.orders:,} orders) in {workdir} ...", flush=True)
    build_sources(workdir / "a" / "data", args.orders)
    shutil.copytree(workdir / "a" / "data", workdir / "b" / "data")
    logs = workdir / "logs"
    logs.mkdir()
    job = str(ROOT / "mvsink_job.py")
    flags = ["--trigger-seconds", str(args.trigger_seconds)]
    results = {}

    pipeline = workdir / "a" / "pipeline"
    write_pipeline(pipeline, workdir / "a" / "data", args.trigger_seconds)
    specs = view_specs(pipeline)
    assert len(specs) == 10
    targets = {spec["view_id"]: spec["target"] for spec in specs}
    results["pipeline"] = run_arm("pipeline", [[sys.executable, job, "--pipeline", str(pipeline), *flags]],
                                  targets, specs[0]["timeline"], workdir / "a" / "data", args, logs)

    configs, singles = [], {}
    timeline = str(workdir / "b" / "views" / "_timeline")
    for spec in specs:   # the same queries, over copy b of the sources, each in a job of its own
        spec = {k: v for k, v in spec.items() if k != "base_dir"}
        spec["sources"] = {name: str(workdir / "b" / "data" / name) for name in spec["sources"]}
        spec["target"] = singles[spec["view_id"]] = str(workdir / "b" / "views" / spec["view_id"])
        spec["timeline"] = timeline
        config = workdir / "b" / f"{spec['view_id']}.yaml"
        config.write_text(yaml.safe_dump(spec))
        configs.append([sys.executable, job, "--config", str(config), "--replica-id", spec["view_id"], *flags])
    results["single"] = run_arm("single", configs, singles, timeline, workdir / "b" / "data", args, logs)
    load_after = os.getloadavg()

    p, s = results["pipeline"], results["single"]
    print("\n=== a pipeline of ten views in one job against ten single-view jobs ===")
    print(f"machine: {machine()}")
    print(f"load average (1, 5, 15 min): before {', '.join(f'{x:.1f}' for x in load_before)}; "
          f"after {', '.join(f'{x:.1f}' for x in load_after)}")
    print(f"workload: {args.orders:,} orders, {max(10, args.orders // 10):,} customers, 25 nations; ten SQL views, "
          f"levels 0-3; {args.times} rounds of 3-4 source commits, one every {args.every:g}s; "
          f"trigger {args.trigger_seconds:g}s; the two arms one after the other, never at once")
    rows = [
        ("processes (JVMs)", "1", "10", None),
        ("start until all hydrated, wall", f"{p['start_wall']:.1f} s", f"{s['start_wall']:.1f} s",
         s["start_wall"] / p["start_wall"]),
        ("start until all hydrated, CPU", f"{p['start_cpu']:.1f} s", f"{s['start_cpu']:.1f} s",
         s["start_cpu"] / p["start_cpu"]),
        ("peak RSS while starting", f"{p['start_peak']:,.0f} MiB", f"{s['start_peak']:,.0f} MiB",
         s["start_peak"] / p["start_peak"]),
        ("CPU per time (steady)", f"{p['cpu_per_time']:.1f} s", f"{s['cpu_per_time']:.1f} s",
         s["cpu_per_time"] / p["cpu_per_time"]),
        ("peak RSS (steady)", f"{p['peak']:,.0f} MiB", f"{s['peak']:,.0f} MiB", s["peak"] / p["peak"]),
    ]
    for q, label in ((0.5, "p50"), (1.0, "max")):
        a, b = percentile(p["freshness"], q), percentile(s["freshness"], q)
        rows.append((f"freshness {label} (source commit to last view)", f"{a:.1f} s", f"{b:.1f} s", b / a))
    print("| | pipeline, one job | ten single-view jobs | single / pipeline |")
    print("| --- | --- | --- | --- |")
    for label, a, b, ratio in rows:
        print(f"| {label} | {a} | {b} | {'' if ratio is None else f'{ratio:.2f}x'} |")
    print(f"freshness per round (s): pipeline {[round(x, 1) for x in p['freshness']]}, "
          f"single {[round(x, 1) for x in s['freshness']]}; mean {statistics.mean(p['freshness']):.1f} "
          f"against {statistics.mean(s['freshness']):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
