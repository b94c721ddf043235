"""A join view on a timeline against recomputing it: overwrite, and MERGE with NOT MATCHED BY
SOURCE DELETE, on the same workload in the same run.

Workload: two sources, ``orders`` (``--rows`` rows) and ``customers`` (``--customers`` rows); the
view is orders joined with their customers in Spark SQL, keyed by order id
(``SELECT o.id, o.amount, c.name, c.segment FROM orders o JOIN customers c ...``).

* **round**: one commit to each source (``--change-fraction`` of the orders updated, 1% of the
  customers moved to another segment), then each contender brings its table up to date:
  mvsink (:meth:`MaterializedView.run_until_caught_up`: one new time, the query evaluated once at
  the pinned versions, the difference committed); *overwrite* (the query, written with
  ``mode("overwrite")``); *MERGE* (the query merged on the key: update when changed, insert when
  not matched, ``WHEN NOT MATCHED BY SOURCE DELETE``).
* **catch-up**: ``--backlog`` rounds of commits to the sources (two commits each) while the view
  does not run, then each contender catches up once. mvsink mints one time for the whole backlog
  (one evaluation of the query). Beside it, the cost without a timeline, where a time was a source
  version and the query ran once per source commit: a second mvsink view on the same sources,
  caught up after every single commit of the backlog (the sum of those catch-ups).

At the end all three tables are compared (an order-independent hash of the view's rows), so
nothing is measured doing the wrong thing. mvsink's time is split by phase from its step
reports where the sink reports them; otherwise total.

Run: ``python benchmarks/bench_timeline.py [--rows 1000000] [--rounds 5] [--backlog 25]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench_sink import WORKDIR_HELP, fingerprint, machine, percentile, work_directory

SQL = "SELECT o.id, o.amount, c.name, c.segment FROM orders o JOIN customers c ON o.customer = c.id"
COLUMNS = ["id", "amount", "name", "segment"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backlog", type=int, default=25)
    parser.add_argument("--change-fraction", type=float, default=0.01)
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    args = parser.parse_args()
    with work_directory(args.workdir, "timeline") as workdir:
        return run(args, workdir)


def run(args, workdir: str) -> int:
    paths = {n: os.path.join(workdir, n) for n in ("orders", "customers", "view", "per_commit", "overwrite",
                                                    "merge")}
    sources = {"orders": paths["orders"], "customers": paths["customers"]}

    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from mvsink import MaterializedView, SnapshotInput, Timeline, ViewDefinition
    from mvsink.target.read import read_view
    from mvsink.spark import spark_session

    spark = spark_session("mvsink-bench-timeline")
    modulus = int(round(1 / args.change_fraction))
    print(f"building {args.rows:,} orders and {args.customers:,} customers in {workdir} ...", flush=True)
    (spark.range(args.rows)
     .select("id", (F.col("id") % args.customers).alias("customer"), (F.col("id") % 997).alias("amount"))
     .write.format("delta").option("delta.enableDeletionVectors", "false").save(sources["orders"]))
    (spark.range(args.customers)
     .select("id", F.concat(F.lit("customer "), F.col("id").cast("string")).alias("name"),
             F.element_at(F.array(F.lit("retail"), F.lit("wholesale"), F.lit("online")),
                          (F.col("id") % 3 + 1).cast("int")).alias("segment"))
     .write.format("delta").option("delta.enableDeletionVectors", "false").save(sources["customers"]))

    definition = ViewDefinition("orders_with_customers", paths["view"], SnapshotInput(sql=SQL), key=("id",),
                                sources=sources, replica_id="bench")
    view = MaterializedView(spark, definition)
    per_commit = MaterializedView(spark, ViewDefinition("per_commit", paths["per_commit"], SnapshotInput(sql=SQL),
                                                        key=("id",), sources=sources, replica_id="bench"))

    def query():
        for name, path in sources.items():
            spark.read.format("delta").load(path).createOrReplaceTempView(name)
        return spark.sql(SQL)

    def overwrite():
        query().write.format("delta").mode("overwrite").save(paths["overwrite"])

    def merge():
        (DeltaTable.forPath(spark, paths["merge"]).alias("t").merge(query().alias("s"), "t.id = s.id")
         .whenMatchedUpdate(condition=" OR ".join(f"NOT (t.{c} <=> s.{c})" for c in COLUMNS[1:]),
                            set={c: f"s.{c}" for c in COLUMNS})
         .whenNotMatchedInsertAll()
         .whenNotMatchedBySourceDelete()
         .execute())

    def timed(fn) -> float:
        started = time.monotonic()
        fn()
        return time.monotonic() - started

    hydration = {"mvsink": timed(view.run_until_caught_up), "overwrite": timed(overwrite)}
    per_commit.run_until_caught_up()
    hydration["MERGE"] = timed(lambda: query().write.format("delta").save(paths["merge"]))
    print("initial load: " + ", ".join(f"{k} {v:.1f}s" for k, v in hydration.items()), flush=True)

    step = [0]

    def change_sources(after_each_commit=lambda: None):
        step[0] += 1
        i = step[0]
        spark.sql(f"UPDATE delta.`{sources['orders']}` SET amount = amount + {i} "
                  f"WHERE pmod(hash(id, {i}), {modulus}) = 0")
        after_each_commit()
        spark.sql(f"UPDATE delta.`{sources['customers']}` SET segment = '{['retail', 'wholesale', 'online'][i % 3]}' "
                  f"WHERE pmod(hash(id, {i}), 100) = 0")
        after_each_commit()

    rounds = {"mvsink": [], "overwrite": [], "MERGE": []}
    for r in range(1, args.rounds + 1):
        change_sources(per_commit.run_until_caught_up)
        rounds["mvsink"].append(timed(view.run_until_caught_up))
        rounds["overwrite"].append(timed(overwrite))
        rounds["MERGE"].append(timed(merge))
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in rounds.items()), flush=True)

    timeline = Timeline(definition.timeline, None)
    before = timeline.refresh()
    per_commit_seconds = []
    for _ in range(args.backlog):
        change_sources(lambda: per_commit_seconds.append(timed(per_commit.run_until_caught_up)))
    catch_up = {"mvsink": timed(view.run_until_caught_up), "overwrite": timed(overwrite), "MERGE": timed(merge)}
    minted = timeline.refresh() - before
    print(f"catch-up after {2 * args.backlog} source commits: "
          + ", ".join(f"{k} {v:.2f}s" for k, v in catch_up.items()) + f"; mvsink minted {minted} time(s); "
          f"one time per commit: {sum(per_commit_seconds):.2f}s", flush=True)

    prints = {"mvsink": fingerprint(read_view(spark, paths["view"], definition.view_id), COLUMNS),
              "overwrite": fingerprint(spark.read.format("delta").load(paths["overwrite"]), COLUMNS),
              "MERGE": fingerprint(spark.read.format("delta").load(paths["merge"]), COLUMNS),
              "per commit": fingerprint(read_view(spark, paths["per_commit"], "per_commit"), COLUMNS),
              "query": fingerprint(query(), COLUMNS)}
    same = len(set(prints.values())) == 1

    print("\n=== a join view on a timeline vs recompute + overwrite vs MERGE ... NOT MATCHED BY SOURCE DELETE ===")
    print(f"machine: {machine()}")
    print(f"workload: {args.rows:,} orders joined with {args.customers:,} customers; per round one commit to "
          f"each source ({args.change_fraction:.0%} of the orders, 1% of the customers); {args.rounds} rounds; "
          f"then a backlog of {2 * args.backlog} source commits")
    print("initial load:  " + "  ".join(f"{k} {v:6.1f}s" for k, v in hydration.items()))
    for name, times in rounds.items():
        print(f"per round {name:9} p50 {percentile(times, 0.5):6.2f}s  p95 {percentile(times, 0.95):6.2f}s  "
              f"mean {statistics.mean(times):6.2f}s")
    print("catch-up:      " + "  ".join(f"{k} {v:6.2f}s" for k, v in catch_up.items())
          + f"  (mvsink: {minted} time(s) for {2 * args.backlog} source commits)")
    print(f"catch-up, one time (one query evaluation) per source commit, as before the timeline: "
          f"{sum(per_commit_seconds):.2f}s in {len(per_commit_seconds)} steps "
          f"(p50 {percentile(per_commit_seconds, 0.5):.2f}s each); timeline / per commit: "
          f"{catch_up['mvsink'] / sum(per_commit_seconds):.2f}")
    print(f"final contents identical (mvsink, mvsink per commit, overwrite, MERGE, the query): {same}")
    spark.stop()
    return 0 if same and minted == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
