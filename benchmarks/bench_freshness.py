"""Freshness: how long after a source commit the view's table has it, for one replica streaming at
a ``--trigger-seconds`` trigger, from the Delta commit timestamps.

Workload: a change-feed view (keyed by ``id``) over a ``--rows``-row source; ``--commits`` source
commits, each updating ``--change-fraction`` of the rows, one every ``--every`` seconds, while
the replica runs as a Structured Streaming query (:meth:`MaterializedView.start_stream`). For each
source version the latency is the timestamp of the first target commit whose upper covers a time
pinning that version (or a later one), minus the source commit's timestamp. Both timestamps are
the Delta log's (commit info ``timestamp``), taken on this machine's clock.

Run: ``python benchmarks/bench_freshness.py [--rows 1000000] [--commits 20] [--trigger-seconds 1]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench_sink import WORKDIR_HELP, machine, percentile, work_directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--trigger-seconds", type=float, default=1.0)
    parser.add_argument("--change-fraction", type=float, default=0.01)
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    args = parser.parse_args()
    with work_directory(args.workdir, "freshness") as workdir:
        return run(args, workdir)


def run(args, workdir: str) -> int:
    source, target = os.path.join(workdir, "source"), os.path.join(workdir, "view")

    from pyspark.sql import functions as F

    from mvsink import ChangesInput, MaterializedView, Timeline, ViewDefinition
    from mvsink.target.commit_info import META_UPPER
    from mvsink.table import commit_info, latest_version
    from mvsink.spark import spark_session

    spark = spark_session("mvsink-bench-freshness")
    modulus = int(round(1 / args.change_fraction))
    print(f"building a {args.rows:,}-row source in {workdir} ...", flush=True)
    (spark.range(args.rows)
     .select("id", (F.col("id") % 997).alias("amount"), F.sha1(F.col("id").cast("string")).alias("note"))
     .write.format("delta").option("delta.enableChangeDataFeed", "true")
     .option("delta.enableDeletionVectors", "false").save(source))
    definition = ViewDefinition("fresh", target, ChangesInput(source), key=("id",), replica_id="bench")
    view = MaterializedView(spark, definition)
    view.run_until_caught_up()
    query = view.start_stream(trigger_seconds=args.trigger_seconds)
    first_version = latest_version(source) + 1
    for i in range(1, args.commits + 1):
        started = time.monotonic()
        spark.sql(f"UPDATE delta.`{source}` SET amount = amount + {i} WHERE pmod(hash(id, {i}), {modulus}) = 0")
        print(f"source commit {i} of {args.commits}", flush=True)
        time.sleep(max(0.0, args.every - (time.monotonic() - started)))
    last_version = latest_version(source)
    deadline = time.monotonic() + 120
    timeline = Timeline(definition.timeline, None)
    while time.monotonic() < deadline:
        timeline.refresh()
        last = timeline.last()
        if last is not None and last.versions["source"] >= last_version and view.observed_upper >= timeline.upper:
            break
        time.sleep(0.5)
    view.stop_stream(query)

    timeline.refresh()
    # The first target commit (its timestamp) whose upper covers each time.
    covered_at: dict[int, int] = {}
    for version in range(0, latest_version(target) + 1):
        info = commit_info(target, version)
        upper = int(info.get(META_UPPER, 0))
        for t in range(upper):
            covered_at.setdefault(t, info["timestamp"])
    latencies = []
    for v in range(first_version, last_version + 1):
        t = next(t for t in range(timeline.upper) if timeline.versions(t)["source"] >= v)
        latencies.append((covered_at[t] - commit_info(source, v)["timestamp"]) / 1000)

    print("\n=== freshness: source commit -> view commit, one replica streaming ===")
    print(f"machine: {machine()}")
    print(f"workload: {args.rows:,}-row change-feed view, {len(latencies)} source commits of "
          f"{args.change_fraction:.0%} each, one every {args.every:g}s, trigger {args.trigger_seconds:g}s")
    print(f"latency p50 {percentile(latencies, 0.5):.2f}s  p95 {percentile(latencies, 0.95):.2f}s  "
          f"max {max(latencies):.2f}s  mean {statistics.mean(latencies):.2f}s")
    print("mvsink per step, by phase (mean): " + ", ".join(
        f"{p} {s / max(1, view.metrics.steps):.2f}s" for p, s in view.metrics.phase_seconds.items()))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
