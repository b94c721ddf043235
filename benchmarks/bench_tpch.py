"""A TPC-H Q3-like view (a three-way join under a GROUP BY) kept by mvsink, overwrite and MERGE.

Workload: customer, orders and lineitem from ``tpchgen-cli`` at ``--scale`` (default 1) loaded into
Delta tables (change data feed on), each laid out by its key (``repartitionByRange``: orders and
lineitem by order key, customer by customer key, so each file holds a range of keys). The view is
TPC-H Q3 without its segment filter and ``LIMIT``: the revenue of every order placed before
1995-03-15 from its lines shipped after it, with the customer's segment, one row per order, keyed
by ``l_orderkey``. Each round applies refreshes in the spirit of TPC-H's: ``--new-fraction`` of the
orders (0.1%) come in as new orders (copies of existing ones with new keys above the largest, with
their lineitems), and ``--delete-fraction`` of the orders (0.1%), the oldest by key, go with their
lineitems (four source commits). Then, in the same run, each contender brings its table up to date:

* mvsink: a :class:`MaterializedView` over the three sources (its strategy is printed; the step's
  phases and the other sides' files read are printed per round);
* overwrite: the query written over its own target with mode ``overwrite``;
* MERGE-sync: ``MERGE`` of the query into its own target on ``l_orderkey``, with update (where a
  column differs), insert and ``WHEN NOT MATCHED BY SOURCE DELETE``;
* the query alone: the query run to a ``noop`` sink (what any full recomputation costs at least).

At the end the three targets are compared through an order-independent hash, so no contender is
timed doing the wrong thing.

Run: ``python benchmarks/bench_tpch.py [--scale 1] [--rounds 5]`` (``pip install -e '.[bench]'`` for
``tpchgen-cli``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sink import WORKDIR_HELP, fingerprint, machine, percentile, work_directory  # noqa: E402

QUERY = """
SELECT l_orderkey, c_mktsegment, o_orderdate, o_shippriority, sum(revenue) AS revenue FROM (
  SELECT l.l_orderkey, c.c_mktsegment, o.o_orderdate, o.o_shippriority,
         l.l_extendedprice * (1 - l.l_discount) AS revenue
  FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey JOIN lineitem l ON l.l_orderkey = o.o_orderkey
  WHERE o.o_orderdate < DATE '1995-03-15' AND l.l_shipdate > DATE '1995-03-15')
GROUP BY l_orderkey, c_mktsegment, o_orderdate, o_shippriority
"""
COLUMNS = ["l_orderkey", "c_mktsegment", "o_orderdate", "o_shippriority", "revenue"]
#: Each table's key, and its files per scale factor 1 (at least 1).
TABLES = {"customer": ("c_custkey", 2), "orders": ("o_orderkey", 16), "lineitem": ("l_orderkey", 48)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1; 0.1 for a quick run)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-fraction", type=float, default=0.001, help="orders added per round (default 0.1%%)")
    parser.add_argument("--delete-fraction", type=float, default=0.001,
                        help="orders deleted per round, the oldest (default 0.1%%)")
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    args = parser.parse_args()
    with work_directory(args.workdir, "tpch") as workdir:
        return run(args, workdir)


def generate(scale: float, directory: str) -> None:
    """customer, orders and lineitem as Parquet files from ``tpchgen-cli``."""
    cli = shutil.which("tpchgen-cli") or os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
    if not os.path.exists(cli):
        raise SystemExit("tpchgen-cli not found: pip install -e '.[bench]'")
    subprocess.run([cli, "parquet", "-s", str(scale), "--tables", "customer,orders,lineitem",
                    "--output-dir", directory], check=True)


def run(args, workdir: str) -> int:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from mvsink import MaterializedView, SnapshotInput, ViewDefinition
    from mvsink.target.read import read_view
    from mvsink.spark import spark_session

    spark = spark_session("mvsink-bench-tpch")
    raw = os.path.join(workdir, "raw")
    started = time.monotonic()
    generate(args.scale, raw)
    generated = time.monotonic() - started
    sources = {name: os.path.join(workdir, name) for name in TABLES}
    started = time.monotonic()
    for name, (key, files) in TABLES.items():
        rows = spark.read.parquet(os.path.join(raw, f"{name}.parquet"))
        (rows.repartitionByRange(max(1, int(files * args.scale)), key).sortWithinPartitions(key)
         .write.format("delta").option("delta.enableChangeDataFeed", "true")
         .option("delta.enableDeletionVectors", "false").save(sources[name]))
    loaded = time.monotonic() - started
    sizes = {name: spark.read.format("delta").load(path).count() for name, path in sources.items()}
    print(f"TPC-H scale {args.scale}: {', '.join(f'{n} {c:,} rows' for n, c in sizes.items())} "
          f"(generated in {generated:.1f}s, loaded into Delta in {loaded:.1f}s)", flush=True)

    def query():
        session = spark.newSession()
        for name, path in sources.items():
            session.read.format("delta").load(path).createOrReplaceTempView(name)
        return session.sql(QUERY)

    targets = {name: os.path.join(workdir, name) for name in ("view", "overwrite", "merge")}
    view = MaterializedView(spark, ViewDefinition("q3", targets["view"], SnapshotInput(sql=QUERY),
                                                  key=("l_orderkey",), sources=sources, replica_id="bench"))
    started = time.monotonic()
    view.run_until_caught_up()
    hydration = {"mvsink": time.monotonic() - started}
    started = time.monotonic()
    query().write.format("delta").save(targets["overwrite"])
    hydration["overwrite"] = time.monotonic() - started
    started = time.monotonic()
    query().write.format("delta").save(targets["merge"])
    hydration["MERGE"] = time.monotonic() - started
    view_rows = spark.read.format("delta").load(targets["overwrite"]).count()
    print(f"view: {view_rows:,} rows; first load mvsink {hydration['mvsink']:.1f}s, overwrite "
          f"{hydration['overwrite']:.1f}s, MERGE target {hydration['MERGE']:.1f}s", flush=True)

    def overwrite():
        query().write.format("delta").mode("overwrite").save(targets["overwrite"])

    changed = " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in COLUMNS[1:])

    def merge():
        (DeltaTable.forPath(spark, targets["merge"]).alias("t").merge(query().alias("s"), "t.l_orderkey = s.l_orderkey")
         .whenMatchedUpdateAll(condition=changed).whenNotMatchedInsertAll().whenNotMatchedBySourceDelete()
         .execute())

    def query_alone():
        query().write.format("noop").mode("overwrite").save()

    orders_count = sizes["orders"]
    new_orders = max(1, int(orders_count * args.new_fraction))
    deleted_orders = max(1, int(orders_count * args.delete_fraction))
    times = {"mvsink": [], "overwrite": [], "MERGE": [], "query alone": []}
    contenders = {"overwrite": overwrite, "MERGE": merge, "query alone": query_alone}
    strategies = set()
    for round_ in range(1, args.rounds + 1):
        orders = spark.read.format("delta").load(sources["orders"])
        lineitem = spark.read.format("delta").load(sources["lineitem"])
        top = orders.agg(F.max("o_orderkey")).first()[0]
        # new orders: copies of existing ones (spread over the key space) with keys above the largest
        picked = orders.where(F.pmod(F.xxhash64("o_orderkey", F.lit(round_)), F.lit(orders_count // new_orders)) == 0)
        picked = picked.limit(new_orders).localCheckpoint()
        (picked.withColumn("o_orderkey", F.col("o_orderkey") + top)
         .write.format("delta").mode("append").save(sources["orders"]))
        (lineitem.join(picked.select(F.col("o_orderkey").alias("l_orderkey")), "l_orderkey", "left_semi")
         .withColumn("l_orderkey", F.col("l_orderkey") + top).select(*lineitem.columns)
         .write.format("delta").mode("append").save(sources["lineitem"]))
        # deleted orders: the oldest
        oldest = (orders.select("o_orderkey").orderBy("o_orderkey").limit(deleted_orders)
                  .agg(F.max("o_orderkey")).first()[0])
        spark.sql(f"DELETE FROM delta.`{sources['orders']}` WHERE o_orderkey <= {oldest}")
        spark.sql(f"DELETE FROM delta.`{sources['lineitem']}` WHERE l_orderkey <= {oldest}")

        started = time.monotonic()
        phases_then = dict(view.metrics.phase_seconds)
        reports = []
        while True:
            report = view.step()
            reports.append(report)
            last = view.timeline.last()
            if (report.desc is None and report.upper >= view.timeline.upper
                    and last.versions == view.desired.latest_versions()):
                break
        times["mvsink"].append(time.monotonic() - started)
        strategies.update(r.strategy for r in reports if r.strategy)
        phases = ", ".join(f"{p} {s - phases_then.get(p, 0.0):.2f}s" for p, s in view.metrics.phase_seconds.items()
                           if s - phases_then.get(p, 0.0) >= 0.005)
        reads = ", ".join(str(r) for report in reports for r in report.reads)
        for name, contender in contenders.items():
            started = time.monotonic()
            contender()
            times[name].append(time.monotonic() - started)
        print(f"round {round_}: +{new_orders:,} orders, -{deleted_orders:,} orders (keys <= {oldest:,}); "
              + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items())
              + f"\n  mvsink by {', '.join(r.strategy or '-' for r in reports)} ({len(reports)} steps): {phases}"
              + f"\n  mvsink read: {reads or 'no Delta scan'}", flush=True)

    hashes = {"mvsink": fingerprint(read_view(spark, targets["view"], "q3"), COLUMNS),
              "overwrite": fingerprint(spark.read.format("delta").load(targets["overwrite"]), COLUMNS),
              "MERGE": fingerprint(spark.read.format("delta").load(targets["merge"]), COLUMNS),
              "query": fingerprint(query(), COLUMNS)}
    same = len({tuple(h) for h in hashes.values()}) == 1
    print("\n=== TPC-H Q3-like view: mvsink vs overwrite vs MERGE-sync vs the query alone ===")
    print(f"machine: {machine()}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    print(f"workload: scale {args.scale}, view {view_rows:,} rows, {args.rounds} rounds of +{new_orders:,} "
          f"orders and -{deleted_orders:,} orders with their lineitems; "
          f"mvsink strategy: {', '.join(sorted(strategies))}")
    for name, values in times.items():
        print(f"{name:12} p50 {percentile(values, 0.5):6.2f}s  p90 {percentile(values, 0.9):6.2f}s  "
              f"mean {statistics.mean(values):6.2f}s")
    for name in ("overwrite", "MERGE", "query alone"):
        print(f"ratio {name} / mvsink: p50 {percentile(times[name], 0.5) / percentile(times['mvsink'], 0.5):.2f}x, "
              f"p90 {percentile(times[name], 0.9) / percentile(times['mvsink'], 0.9):.2f}x")
    print(f"final contents identical (rows, hash): {same} "
          f"({', '.join(f'{n} {h[1]:,}' for n, h in hashes.items())})")
    spark.stop()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
