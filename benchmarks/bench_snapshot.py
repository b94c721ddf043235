"""A snapshot view (a query over a source) against recomputing it: overwrite, and MERGE with
NOT MATCHED BY SOURCE DELETE, on the same workload in the same run.

Workload: one source of ``--rows`` rows; each round updates ``--change-fraction`` of them (1%),
or deletes them (``--delete``: a DELETE rewrites its files without their rows, in their order).
Three views, chosen with ``--query`` (the first two are row-wise: mvsink applies them to the
source's change data feed; the aggregate is a linear aggregate: mvsink keeps its groups' counts and
sums and moves them by the change feed; ``--recompute`` makes mvsink evaluate any query in full):

* ``identity``: ``SELECT id, customer, amount, note FROM source`` keyed by ``id`` (the view is the
  table: every changed row is a changed view row);
* ``filter``: ``SELECT id, customer, amount * 2 AS doubled FROM source WHERE amount % 3 = 0``
  keyed by ``id`` (a projection with an expression and a filter that updated rows enter and leave);
* ``aggregate``: ``SELECT customer, count(*), sum(amount) FROM source GROUP BY customer`` keyed by
  ``customer`` (``--rows`` rows into ``--groups`` groups: most groups change each round).

Per round, after the source commit, the new version's Delta snapshot is built once (read by
everyone alike; before, mvsink ran first and built it for the others) and timed apart; then each
contender brings its table up to date: mvsink
(:meth:`MaterializedView.run_until_caught_up`: one new time, its changes computed (row-wise: the
query over the change feed; else the query evaluated at the pinned version and diffed with the
last result) and committed, then a step that finds nothing to do), *overwrite*
(the query written with ``mode("overwrite")``) and *MERGE* (the query merged on the key: update
when changed, insert when not matched, ``WHEN NOT MATCHED BY SOURCE DELETE``); and, as the floor,
*query* (the query evaluated, every output column, into Spark's ``noop`` sink: writing nothing;
a count would let Spark skip the columns). mvsink's time is split by phase.
At the end the three tables and the query are compared through an order-independent hash.
Before the initial loads, mvsink and overwrite each load a source of ``--rows``/20 once, so that
neither pays for warming the JVM up (as in ``bench_sink.py``); those times are printed apart.

With ``--no-feed`` the source has no change data feed: mvsink reads a commit's changes as the rows
of the files it removed against those of the files it added (``desired/log_changes.py``).

Run: ``python benchmarks/bench_snapshot.py [--query identity|filter|aggregate] [--rows 1000000] [--rounds 5] [--no-feed]
[--recompute]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench_sink import WORKDIR_HELP, fingerprint, machine, percentile, work_directory

QUERIES = {
    "identity": ("SELECT id, customer, amount, note FROM source", ("id",)),
    "filter": ("SELECT id, customer, amount * 2 AS doubled FROM source WHERE amount % 3 = 0", ("id",)),
    "aggregate": ("SELECT customer, count(*) AS orders, sum(amount) AS amount FROM source GROUP BY customer",
                  ("customer",)),
}


def _path(desired) -> str:
    """How mvsink computes the view's changes."""
    if desired.row_wise:
        return "row-wise (the query over the change feed)"
    if desired.aggregate is not None:
        return "a linear aggregate (its groups' state moved by the change feed)"
    return "recomputing"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--query", choices=sorted(QUERIES), default="identity")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--change-fraction", type=float, default=0.01)
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    parser.add_argument("--no-feed", action="store_true",
                        help="the source without its change data feed (mvsink reads a commit's added and removed files)")
    parser.add_argument("--delete", action="store_true",
                        help="each round deletes the rows instead of updating them")
    parser.add_argument("--recompute", action="store_true",
                        help="evaluate the query in full each round even where it is row-wise or a linear aggregate")
    args = parser.parse_args()
    with work_directory(args.workdir, "snapshot") as workdir:
        return run(args, workdir)


def run(args, workdir: str) -> int:
    paths = {n: os.path.join(workdir, n) for n in ("source", "view", "overwrite", "merge")}
    sql, key = QUERIES[args.query]

    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from mvsink import MaterializedView, SnapshotInput, ViewDefinition
    from mvsink.target.read import read_view
    from mvsink.spark import spark_session

    spark = spark_session("mvsink-bench-snapshot")
    modulus = int(round(1 / args.change_fraction))
    print(f"building a {args.rows:,}-row source in {workdir} ...", flush=True)

    def build(path, rows):
        (spark.range(rows)
         .select("id", F.concat(F.lit("customer-"), (F.col("id") % args.groups).cast("string")).alias("customer"),
                 (F.col("id") % 997).alias("amount"), F.sha1(F.col("id").cast("string")).alias("note"))
         .write.format("delta").option("delta.enableDeletionVectors", "false")
         .option("delta.enableChangeDataFeed", str(not args.no_feed).lower()).save(path))

    def materialized_view(name, source, target):
        definition = ViewDefinition(name, target, SnapshotInput(sql=sql), key=key, sources={"source": source},
                                    replica_id="bench")
        view = MaterializedView(spark, definition)
        if args.recompute:
            view.desired.row_wise, view.desired.aggregate = False, None
        return view

    def query(source=paths["source"]):
        spark.read.format("delta").load(source).createOrReplaceTempView("source")
        return spark.sql(sql)

    def overwrite(source=paths["source"], target=paths["overwrite"]):
        query(source).write.format("delta").mode("overwrite").save(target)

    def timed(fn) -> float:
        started = time.monotonic()
        fn()
        return time.monotonic() - started

    build(paths["source"], args.rows)
    # Both initial loads once on a small source first, so that neither pays for warming the JVM up
    # (mvsink's first Arrow and Python tasks, the first Delta write), as in bench_sink.py.
    warm, warm_rows = os.path.join(workdir, "warm-up"), max(1, args.rows // 20)
    build(warm, warm_rows)
    warm_up = {"mvsink": timed(materialized_view("warm", warm, warm + "-view").run_until_caught_up),
               "overwrite": timed(lambda: overwrite(warm, warm + "-overwrite"))}
    warm_up_line = (f"warm-up initial loads (a cold JVM, a {warm_rows:,}-row source): "
                    + ", ".join(f"{k} {v:.1f}s" for k, v in warm_up.items()))
    print(warm_up_line, flush=True)

    view = materialized_view("bench", paths["source"], paths["view"])
    columns = query().columns

    def merge():
        (DeltaTable.forPath(spark, paths["merge"]).alias("t").merge(
            query().alias("s"), " AND ".join(f"t.{k} = s.{k}" for k in key))
         .whenMatchedUpdate(condition=" OR ".join(f"NOT (t.{c} <=> s.{c})" for c in columns if c not in key),
                            set={c: f"s.{c}" for c in columns})
         .whenNotMatchedInsertAll()
         .whenNotMatchedBySourceDelete()
         .execute())

    # The query run once first, so that the source's log replay and the page cache serve all alike.
    query().write.format("noop").mode("overwrite").save()
    hydration = {"mvsink": timed(view.run_until_caught_up), "overwrite": timed(overwrite),
                 "MERGE": timed(lambda: query().write.format("delta").save(paths["merge"]))}
    print("initial load: " + ", ".join(f"{k} {v:.1f}s" for k, v in hydration.items()), flush=True)

    rounds = {"mvsink": [], "overwrite": [], "MERGE": [], "query": []}
    snapshot = []
    phases_before, jobs_before = dict(view.metrics.phase_seconds), dict(view.metrics.phase_spark_jobs)
    for r in range(1, args.rounds + 1):
        changed = f"WHERE pmod(hash(id, {r}), {modulus}) = 0"
        spark.sql(f"DELETE FROM delta.`{paths['source']}` {changed}" if args.delete
                  else f"UPDATE delta.`{paths['source']}` SET amount = amount + {r} {changed}")
        # The new version's Delta snapshot (its file list, from the log) is built by whoever reads
        # that version first, and then kept in the JVM: built here, once for all, and timed apart,
        # so that no contender pays it for the others.
        snapshot.append(timed(lambda: spark.read.format("delta").load(paths["source"]).count()))
        phases_then, jobs_then = dict(view.metrics.phase_seconds), dict(view.metrics.phase_spark_jobs)
        rounds["mvsink"].append(timed(view.run_until_caught_up))
        mvsink_phases = ", ".join(f"{p} {s - phases_then.get(p, 0.0):.2f}s/{view.metrics.phase_spark_jobs.get(p, 0) - jobs_then.get(p, 0)}j"
                                  for p, s in view.metrics.phase_seconds.items())
        rounds["overwrite"].append(timed(overwrite))
        rounds["MERGE"].append(timed(merge))
        rounds["query"].append(timed(lambda: query().write.format("noop").mode("overwrite").save()))
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in rounds.items())
              + f" (the version's snapshot, built first for all: {snapshot[-1]:.2f}s; mvsink: {mvsink_phases})",
              flush=True)
    spent = {p: s - phases_before.get(p, 0.0) for p, s in view.metrics.phase_seconds.items()}

    prints = {"mvsink": fingerprint(read_view(spark, paths["view"], view.view.view_id), columns),
              "overwrite": fingerprint(spark.read.format("delta").load(paths["overwrite"]), columns),
              "MERGE": fingerprint(spark.read.format("delta").load(paths["merge"]), columns),
              "query": fingerprint(query(), columns)}
    same = len(set(prints.values())) == 1
    view_rows = prints["query"]["n"]

    print(f"\n=== a snapshot view ({args.query}) vs recompute + overwrite vs MERGE ... NOT MATCHED BY SOURCE DELETE ===")
    print(f"machine: {machine()}")
    print(f"workload: {sql!r} over {args.rows:,} rows ({view_rows:,} view rows; change data feed {'off' if args.no_feed else 'on'}); "
          f"per round one source commit {'deleting' if args.delete else 'updating'} {args.change_fraction:.0%} of them; {args.rounds} rounds; "
          f"mvsink {_path(view.desired)}")
    print(warm_up_line)
    print("initial load:  " + "  ".join(f"{k} {v:6.1f}s" for k, v in hydration.items()))
    print("mvsink initial load, by phase: " + ", ".join(
        f"{p} {s:.2f}s ({jobs_before.get(p, 0)} jobs)" for p, s in phases_before.items()))
    for name, times in rounds.items():
        print(f"per round {name:9} p50 {percentile(times, 0.5):6.2f}s  p95 {percentile(times, 0.95):6.2f}s  "
              f"mean {statistics.mean(times):6.2f}s")
    mv = percentile(rounds["mvsink"], 0.5)
    print(f"ratio to mvsink (p50): overwrite {percentile(rounds['overwrite'], 0.5) / mv:.2f}x, "
          f"MERGE {percentile(rounds['MERGE'], 0.5) / mv:.2f}x, query alone {percentile(rounds['query'], 0.5) / mv:.2f}x")
    print(f"the source version's Delta snapshot, built before the contenders each round: p50 "
          f"{percentile(snapshot, 0.5):.2f}s (paid by whoever reads a new version first; no contender's time)")
    print("mvsink per round, by phase (mean): " + ", ".join(f"{p} {s / args.rounds:.2f}s" for p, s in spent.items()))
    print(f"final contents identical (mvsink, overwrite, MERGE, the query): {same}")
    spark.stop()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
