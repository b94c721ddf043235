"""A long run: file count, log size and read time of a view's table with retention against without.

Workload: a change-feed view keyed by ``id`` over a source of ``--rows`` rows; ``--commits``
source commits (each inserts a few rows and updates a few), the view stepped (caught up) after
every ``--every`` of them. Two views run side by side on the same source in the same process:
``retain_history: --retain`` (times) and ``retain_history: all`` (what every table did before
retention: it only grew). Every ``--report`` commits both print: data files, table versions,
checkpoints, the time to read the view with mvsink (``read_view(...).count()``) and with DuckDB's
``delta_scan`` and the SQL of ``mvsink sql`` (no mvsink on the path), and the time of the last
step. At the end the two views' rows are compared, so nothing is measured doing the wrong thing.

Run: ``python benchmarks/bench_retention.py [--commits 500] [--every 5] [--retain 20]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench_sink import WORKDIR_HELP, machine, work_directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--every", type=int, default=5, help="source commits per step")
    parser.add_argument("--retain", type=int, default=20, help="retain_history in times")
    parser.add_argument("--report", type=int, default=50)
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    args = parser.parse_args()
    with work_directory(args.workdir, "retention") as workdir:
        return run(args, workdir)


def run(args, workdir: str) -> int:

    import duckdb
    import duckdb_ext
    from deltalake import DeltaTable

    from mvsink import ChangesInput, MaterializedView, ViewDefinition, read_view
    from mvsink.target.read import plain_sql
    from mvsink.spark import spark_session

    spark = spark_session("mvsink-bench-retention")
    spark.sparkContext.setLogLevel("ERROR")
    con = duckdb.connect(config={"extension_directory": str(Path(list(duckdb_ext.__path__)[0]) / "extensions"),
                                 "autoinstall_known_extensions": False})
    con.execute("LOAD delta")
    src = os.path.join(workdir, "src")
    spark.range(args.rows).selectExpr("id", "concat('v', id) AS v").write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(src)
    spark.sql(f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    views = {}
    for name, retain in (("retained", args.retain), ("all", "all")):
        target = os.path.join(workdir, name)
        views[name] = (target, MaterializedView(spark, ViewDefinition(
            name, target, ChangesInput(src), key=("id",), replica_id="bench", retain_history=retain,
            timeline=os.path.join(workdir, "timeline"))))

    print(machine())
    print(f"conditions: {args.rows} rows, {args.commits} source commits (3 inserts + 3 updates each), "
          f"a step every {args.every} commits, retain_history {args.retain} times vs all; workdir {workdir}")
    print(f"{'commits':>7} {'view':>8} {'files':>6} {'versions':>8} {'ckpts':>5} {'read mvsink s':>13} "
          f"{'read duckdb s':>13} {'last step s':>11}")
    step_seconds = {name: 0.0 for name in views}
    next_id = args.rows
    for n in range(1, args.commits + 1):
        spark.sql(f"INSERT INTO delta.`{src}` VALUES ({next_id}, 'n'), ({next_id + 1}, 'n'), ({next_id + 2}, 'n')")
        spark.sql(f"UPDATE delta.`{src}` SET v = concat(v, '+') WHERE id IN ({n}, {n * 7 % args.rows}, "
                  f"{n * 13 % args.rows})")
        next_id += 3
        if n % args.every == 0:
            for name, (_, mv) in views.items():
                started = time.monotonic()
                mv.run_until_caught_up()
                step_seconds[name] = time.monotonic() - started
        if n % args.report == 0 or n == args.commits:
            for name, (target, _) in views.items():
                table = DeltaTable(target)
                checkpoints = sum(f.endswith(".checkpoint.parquet") for f in os.listdir(f"{target}/_delta_log"))
                started = time.monotonic()
                read_view(spark, target, name).count()
                read_mvsink = time.monotonic() - started
                started = time.monotonic()
                con.sql(f"SELECT count(*) FROM ({plain_sql(target)})").fetchall()
                read_duckdb = time.monotonic() - started
                print(f"{n:>7} {name:>8} {len(table.file_uris()):>6} {table.version() + 1:>8} {checkpoints:>5} "
                      f"{read_mvsink:>13.2f} {read_duckdb:>13.2f} {step_seconds[name]:>11.2f}", flush=True)
    rows = {name: sorted(tuple(r) for r in con.sql(plain_sql(target)).fetchall())
            for name, (target, _) in views.items()}
    same = rows["retained"] == rows["all"]
    print(f"both views hold the same {len(rows['all'])} rows: {same}")
    spark.stop()
    return 0 if same else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(main())
