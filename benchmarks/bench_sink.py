"""mvsink against a foreachBatch with Delta MERGE, on the same workload in the same run.

Workload: a source Delta table of ``--rows`` rows (change data feed on); each of ``--versions``
source versions updates ``--change-fraction`` of its rows (1% by default). The view is the source
keyed by ``id``.

* mvsink: a :class:`MaterializedView` over the source's change feed. Per version, the time from
  the source commit until the view is caught up (one step writes the version, the next reads its
  own commit back).
* MERGE: what a user would write without mvsink: the version's change feed applied to a copy of
  the source by ``DeltaTable.merge`` on the key (delete / update / insert), the body of a
  ``foreachBatch`` over the change feed. Per version, the time of that function. Twice: into a
  copy without deletion vectors (MERGE rewrites the files it touches) and into one with them
  (``delta.enableDeletionVectors``: MERGE marks the old rows deleted), as a user may have either.

The view's ``--deletion-vectors`` is its setting of that name: ``on`` marks its retractions in
deletion vectors, ``off`` rewrites the files holding them (``auto`` on a new target: ``off``).

Both run in one Spark session, one after the other for each version, on the same source commit;
stream trigger overheads are left out for both. At the end both targets are compared row for row
(through an order-independent hash), so neither is measured doing the wrong thing.

Run: ``python benchmarks/bench_sink.py [--rows 1000000] [--versions 20]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


WORKDIR_HELP = "where the tables go, kept after the run (default: a temporary directory, removed at the end)"


@contextlib.contextmanager
def work_directory(given: str | None, name: str):
    """An empty directory for the run's tables: ``given`` (emptied first, kept after the run for a
    look), else a new temporary directory, removed at the end (a 10M-row run leaves about 6 GB)."""
    path = given or tempfile.mkdtemp(prefix=f"mvsink-bench-{name}-")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    try:
        yield path
    finally:
        if given is None:
            shutil.rmtree(path, ignore_errors=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def fingerprint(df, columns: list[str]):
    """An order-independent hash and the count of ``df``'s rows over ``columns``."""
    from pyspark.sql import functions as F

    return df.select(F.sum(F.pmod(F.xxhash64(*columns), F.lit(2**31 - 1))).alias("h"),
                     F.count("*").alias("n")).first()


def live_heap_mib(spark) -> float:
    """The JVM's heap in use after a full collection, in MiB: what the session holds between
    steps (the driver's JVM; in local mode the tasks run in it too)."""
    jvm = spark.sparkContext._jvm
    jvm.System.gc()
    runtime = jvm.java.lang.Runtime.getRuntime()
    return (runtime.totalMemory() - runtime.freeMemory()) / 2**20


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    import deltalake
    import pyspark

    from mvsink.spark import DELTA_VERSION

    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, {platform.system()} {platform.release()}; "
            f"Python {platform.python_version()}, {java}, pyspark {pyspark.__version__}, "
            f"delta-spark {DELTA_VERSION}, deltalake {deltalake.__version__}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--versions", type=int, default=20)
    parser.add_argument("--change-fraction", type=float, default=0.01)
    parser.add_argument("--layout", choices=["table", "updates"], default="table",
                        help="the view's target layout (default: table)")
    parser.add_argument("--deletion-vectors", choices=["auto", "on", "off"], default="auto",
                        help="the view's deletion_vectors setting (default: auto, which is off on a new target)")
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    args = parser.parse_args()
    with work_directory(args.workdir, "sink") as workdir:
        return run(args, workdir)


def run(args, workdir: str) -> int:
    source, view_target = os.path.join(workdir, "source"), os.path.join(workdir, "view")
    merge_targets = {"MERGE": os.path.join(workdir, "merge"), "MERGE+DV": os.path.join(workdir, "merge-dv")}

    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from mvsink import ChangesInput, MaterializedView, ViewDefinition
    from mvsink.spark import spark_session

    spark = spark_session("mvsink-bench")
    modulus = int(round(1 / args.change_fraction))
    print(f"building a {args.rows:,}-row source in {workdir} ...", flush=True)

    def build(path, rows):
        (spark.range(rows)
         .select("id", F.concat(F.lit("customer-"), (F.col("id") % 5000).cast("string")).alias("customer"),
                 (F.col("id") % 997).alias("amount"), F.sha1(F.col("id").cast("string")).alias("note"))
         .write.format("delta").option("delta.enableChangeDataFeed", "true")
         .option("delta.enableDeletionVectors", "false").save(path))

    def first_version(path):
        return spark.read.format("delta").option("versionAsOf", 0).load(path)

    def copy(path, target, deletion_vectors=False):
        (first_version(path).write.format("delta")
         .option("delta.enableDeletionVectors", str(deletion_vectors).lower()).save(target))

    build(source, args.rows)
    # Both initial loads once on a small table first, so that neither pays for warming the JVM up.
    warm = os.path.join(workdir, "warm-up")
    build(warm, max(1, args.rows // 20))
    MaterializedView(spark, ViewDefinition("warm", warm + "-view", ChangesInput(warm), key=("id",),
                                           replica_id="bench", layout=args.layout,
                                           deletion_vectors=args.deletion_vectors)).run_until_caught_up()
    copy(warm, warm + "-copy")
    # And the source read once, so that its log replay and the page cache serve both alike.
    first_version(source).write.format("noop").mode("overwrite").save()

    view = MaterializedView(spark, ViewDefinition("bench", view_target, ChangesInput(source), key=("id",),
                                                  replica_id="bench", layout=args.layout,
                                                  deletion_vectors=args.deletion_vectors))
    started = time.monotonic()
    view.run_until_caught_up()
    mvsink_hydration = time.monotonic() - started
    hydration_heap = live_heap_mib(spark)
    merge_hydration = {}
    for name, target in merge_targets.items():
        started = time.monotonic()
        copy(source, target, deletion_vectors=name == "MERGE+DV")
        merge_hydration[name] = time.monotonic() - started
    merge_tables = {name: DeltaTable.forPath(spark, target) for name, target in merge_targets.items()}
    columns = ["id", "customer", "amount", "note"]

    def merge_batch(merge_table, changes):
        """The foreachBatch body a user would write: apply the change feed with MERGE."""
        latest = changes.where(F.col("_change_type") != "update_preimage")
        (merge_table.alias("t").merge(latest.alias("s"), "t.id = s.id")
         .whenMatchedDelete(condition="s._change_type = 'delete'")
         .whenMatchedUpdate(set={c: f"s.{c}" for c in columns})
         .whenNotMatchedInsert(condition="s._change_type != 'delete'", values={c: f"s.{c}" for c in columns})
         .execute())

    mvsink_times, updates, changed = [], [], []
    merge_times: dict[str, list[float]] = {name: [] for name in merge_targets}
    phases_before, jobs_before = dict(view.metrics.phase_seconds), dict(view.metrics.phase_spark_jobs)
    for i in range(1, args.versions + 1):
        spark.sql(f"UPDATE delta.`{source}` SET amount = amount + {i} "
                  f"WHERE pmod(hash(id, {i}), {modulus}) = 0")
        version = i
        started = time.monotonic()
        phases_then = dict(view.metrics.phase_seconds)
        report = view.run_until_caught_up()
        mvsink_times.append(time.monotonic() - started)
        phases = ", ".join(f"{p} {s - phases_then.get(p, 0.0):.2f}s" for p, s in view.metrics.phase_seconds.items())
        assert report.upper == version + 1
        feed = (spark.read.format("delta").option("readChangeFeed", "true")
                .option("startingVersion", version).option("endingVersion", version).load(source))
        for name, merge_table in merge_tables.items():
            started = time.monotonic()
            merge_batch(merge_table, feed)
            merge_times[name].append(time.monotonic() - started)
        changed.append(feed.where(F.col("_change_type") == "update_postimage").count())
        written = 2 * changed[-1]  # each changed row: its old row out, its new row in
        updates.append(written)
        print(f"version {version:3d}: {changed[-1]:,} rows changed, mvsink {mvsink_times[-1]:.2f}s "
              f"({written:,} updates; {phases}), " + ", ".join(f"{name} {times[-1]:.2f}s" for name, times
                                                               in merge_times.items()), flush=True)

    steps_heap = live_heap_mib(spark)
    from mvsink.target.read import read_view

    mine = fingerprint(read_view(spark, view_target, "bench"), columns)
    same = all(mine == fingerprint(spark.read.format("delta").load(target), columns)
               for target in merge_targets.values())

    def line(name, times, rows):
        return (f"{name:7} p50 {percentile(times, 0.5):6.2f}s  p95 {percentile(times, 0.95):6.2f}s  "
                f"mean {statistics.mean(times):6.2f}s  {sum(rows) / sum(times):9,.0f} rows changed/s")

    print("\n=== mvsink vs foreachBatch + MERGE ===")
    print(f"machine: {machine()}")
    print(f"workload: {args.rows:,}-row view ({args.layout} layout, deletion_vectors: {args.deletion_vectors}), "
          f"{args.versions} source versions, each updating {args.change_fraction:.2%} of the rows "
          f"(about {statistics.mean(changed):,.0f})")
    print(f"initial load: mvsink {mvsink_hydration:.1f}s, " + ", ".join(
        f"{name} target copy {seconds:.1f}s" for name, seconds in merge_hydration.items()))
    print("mvsink initial load, by phase: " + ", ".join(
        f"{p} {s:.2f}s ({jobs_before.get(p, 0)} jobs)" for p, s in phases_before.items()))
    print(line("mvsink", mvsink_times, changed)
          + f"  {sum(updates) / sum(mvsink_times):9,.0f} updates committed/s")
    for name, times in merge_times.items():
        print(line(name, times, changed))
        print(f"ratio ({name} / mvsink): p50 {percentile(times, 0.5) / percentile(mvsink_times, 0.5):.2f}x, "
              f"p95 {percentile(times, 0.95) / percentile(mvsink_times, 0.95):.2f}x")
    print(f"the view's table: {len(spark.read.format('delta').load(view_target).inputFiles())} data files "
          "after the versions")
    spent = {p: s - phases_before.get(p, 0.0) for p, s in view.metrics.phase_seconds.items()}
    print("mvsink per version, by phase (mean over all steps): " + ", ".join(
        f"{p} {s / args.versions:.2f}s" for p, s in spent.items()))
    max_heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory() / 2**20
    print(f"JVM heap (spark.driver.memory {spark.conf.get('spark.driver.memory')}, max {max_heap:,.0f} MiB, "
          f"shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}): live after a full GC "
          f"{hydration_heap:,.0f} MiB after mvsink's initial load, {steps_heap:,.0f} MiB after the versions")
    print(f"final contents identical: {same}")
    spark.stop()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
