"""A long run of small changes: does a view's table keep a bounded number of files?

Workload: a change-feed view keyed by ``id`` (the table layout) over a source of ``--rows`` rows;
``--steps`` steps, each one source commit and the view caught up: in turn an insert of
``--batch`` new rows (a small file of their own), an update of ``--batch`` rows at random, a
delete of ``--batch`` rows at random. Every ``--report`` steps it prints the view's data files
(and the largest count so far), the error files, the compactions so far (mvsink's upkeep folds
small files through the commit path), the table's versions and the last step's seconds. At the
end every committed version of the view is checked against the source at the version its time
stands for (:func:`mvsink.check.check_table`), so the count is not bought with wrong rows.

Run: ``python benchmarks/bench_file_count.py [--rows 10000] [--steps 500]``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_sink import WORKDIR_HELP, machine, work_directory  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch", type=int, default=20, help="rows inserted, updated or deleted per step")
    parser.add_argument("--report", type=int, default=50)
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    args = parser.parse_args()
    with work_directory(args.workdir, "file-count") as workdir:
        return run(args, workdir)


def run(args, workdir: str) -> int:
    from deltalake import DeltaTable

    from mvsink import ChangesInput, MaterializedView, ViewDefinition
    from mvsink.append.retention import COMPACT_SMALL_FILES
    from mvsink.check import check_table, expected_from_source
    from mvsink.spark import spark_session

    spark = spark_session("mvsink-bench-file-count")
    src, target = os.path.join(workdir, "src"), os.path.join(workdir, "view")
    spark.range(args.rows).selectExpr("id", "concat('v', id) AS v").write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(src)
    view = ViewDefinition("files", target, ChangesInput(src), key=("id",), replica_id="bench",
                          timeline=os.path.join(workdir, "timeline"))
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()
    print(machine())
    print(f"workload: {args.rows:,} rows, {args.steps} steps, each inserting, updating or deleting "
          f"{args.batch} rows in turn (one source commit); compaction when more than {COMPACT_SMALL_FILES} "
          f"small files; workdir {workdir}")
    print(f"{'step':>5} {'files':>6} {'most':>5} {'error files':>11} {'compactions':>11} {'versions':>8} "
          f"{'last step s':>11}", flush=True)
    pick, live, next_id, most, seconds = random.Random(1), list(range(args.rows)), args.rows, 0, []
    for step in range(1, args.steps + 1):
        if step % 3 == 1:
            ids = list(range(next_id, next_id + args.batch))
            next_id += args.batch
            live += ids
            spark.sql(f"INSERT INTO delta.`{src}` VALUES " + ", ".join(f"({i}, 'n{i}')" for i in ids))
        else:
            ids = pick.sample(live, args.batch)
            listed = ", ".join(map(str, ids))
            if step % 3 == 2:
                spark.sql(f"UPDATE delta.`{src}` SET v = concat(v, '+') WHERE id IN ({listed})")
            else:
                spark.sql(f"DELETE FROM delta.`{src}` WHERE id IN ({listed})")
                gone = set(ids)
                live = [i for i in live if i not in gone]
        started = time.monotonic()
        mv.run_until_caught_up()
        seconds.append(time.monotonic() - started)
        files = len(DeltaTable(target).file_uris())
        most = max(most, files)
        if step % args.report == 0 or step == args.steps:
            print(f"{step:>5} {files:>6} {most:>5} {len(mv.readback.error_files):>11} {mv.upkeep.compactions:>11} "
                  f"{DeltaTable(target).version() + 1:>8} {seconds[-1]:>11.2f}", flush=True)
    seconds.sort()
    print(f"steps: p50 {seconds[len(seconds) // 2]:.2f} s, p95 {seconds[int(len(seconds) * 0.95)]:.2f} s; "
          f"data files at most {most} over {args.steps} steps, {mv.upkeep.compactions} compactions")
    result = check_table(target, "files", ["id", "v"], expected_from_source(src, ["id", "v"], timeline=view.timeline))
    print(f"every committed version ({result.versions_checked} checked) is the source at its time: {result.ok}"
          + ("" if result.ok else f"; {result.problems[:3]}"))
    spark.stop()
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
