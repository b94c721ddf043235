"""Reading a view kept by mvsink against reading the same rows in a plain Delta table, same run.

Workload: a source Delta table of ``--rows`` rows (change data feed on); ``--steps`` source
versions each update ``--change-fraction`` of its rows at random (with ``--inserts-and-deletes``,
each step also inserts and deletes a tenth of that many rows, in versions of their own), and an
mvsink view of the source keyed by ``id`` follows every version (in the table layout, the default; with ``--with-updates-layout``
also a second view in the update layout, for the figures before it). Then the view's latest rows
are read, and the same rows in two plain Delta tables: one written once by overwrite at the end (no
history), and one overwritten with the source's rows at every step, as a user who keeps the view by
overwrite has it (its log as long as the view's: the cost of replaying a log of that many versions
falls on both alike):

* Spark: ``count(*)`` and ``sum(amount)`` over every row, and the row of one key;
* DuckDB (``delta_scan`` of the ``duckdb-ext-delta`` package): the same two queries.

The table layout is read as any reader reads a table (``spark.read.format("delta")``,
``delta_scan``); the update layout with ``read_view`` and the SQL ``mvsink sql`` prints. Each
read runs once to warm up, then ``--repeat`` times, the readers taking turns read by read (so a
load elsewhere on the machine falls on them alike); the median is printed with the ratio to the
plain table. The answers are compared, so no reader is timed reading something else.

Run: ``python benchmarks/bench_read.py [--rows 1000000] [--steps 100]``; with ``--workdir DIR`` the
tables stay, and ``--reads-only --workdir DIR`` times the reads of them again (on a quieter
machine, say) without building the view again.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_sink import WORKDIR_HELP, machine, work_directory  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--change-fraction", type=float, default=0.01)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--inserts-and-deletes", action="store_true",
                        help="each step also inserts and deletes rows (new files, shrinking files)")
    parser.add_argument("--source-deletion-vectors", action="store_true",
                        help="the source has deletion vectors on, so its own updates stay cheap at 10M rows "
                             "(the view is read from its change data feed either way)")
    parser.add_argument("--deletion-vectors", choices=["auto", "on", "off"], default="auto",
                        help="the table-layout view's deletion_vectors setting (auto: off on a new target)")
    parser.add_argument("--with-updates-layout", action="store_true",
                        help="also keep the view in the update layout and read it")
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    parser.add_argument("--reads-only", action="store_true",
                        help="only time the reads, of the tables an earlier run left in --workdir (give it the "
                             "same --rows): the reads again on a quieter machine, without building the view again")
    args = parser.parse_args()
    if args.reads_only:
        if not args.workdir or not os.path.isdir(os.path.join(args.workdir, "plain")):
            parser.error("--reads-only needs the --workdir of an earlier run, with its view and plain tables")
        return run(args, args.workdir)
    with work_directory(args.workdir, "read") as workdir:
        return run(args, workdir)


def run(args, workdir: str) -> int:
    from pyspark.sql import functions as F

    from mvsink.target.read import plain_sql, read_view
    from mvsink.spark import spark_session
    from deltalake import DeltaTable

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from helpers import duckdb_with_delta

    spark = spark_session("mvsink-bench-read")
    source, table_view, updates_view, plain, overwritten = (
        os.path.join(workdir, n) for n in ("source", "view", "updates", "plain", "overwritten"))
    write_seconds: dict[str, list[float]] = {}
    most_files = None
    if not args.reads_only:
        write_seconds, most_files = build(args, spark, source, table_view, updates_view, plain, overwritten)
    key = args.rows // 2 + 7
    con = duckdb_with_delta()
    full_sql = "SELECT count(*), sum(amount) FROM ({})"
    key_sql = f"SELECT * FROM ({{}}) WHERE id = {key}"

    def table_reads(path: str) -> dict:
        return {
            "spark, every row": lambda: tuple(spark.read.format("delta").load(path).agg(F.count("*"), F.sum("amount")).first()),
            "spark, one key": lambda: tuple(spark.read.format("delta").load(path).where(F.col("id") == key).first()),
            "duckdb, every row": lambda: con.sql(full_sql.format(f"SELECT * FROM delta_scan('{path}')")).fetchone(),
            "duckdb, one key": lambda: con.sql(key_sql.format(f"SELECT * FROM delta_scan('{path}')")).fetchone(),
        }

    readers = {"plain table": table_reads(plain)}
    if os.path.isdir(overwritten):  # (a run before it was kept has none)
        readers["plain, overwritten each step"] = table_reads(overwritten)
    readers["mvsink, table layout"] = table_reads(table_view)
    if args.with_updates_layout:
        readers["mvsink, update layout"] = {
            "spark, every row": lambda: tuple(read_view(spark, updates_view, "bench").agg(F.count("*"), F.sum("amount")).first()),
            "spark, one key": lambda: tuple(read_view(spark, updates_view, "bench").where(F.col("id") == key).first()),
            "duckdb, every row": lambda: con.sql(full_sql.format(plain_sql(updates_view))).fetchone(),
            "duckdb, one key": lambda: con.sql(key_sql.format(plain_sql(updates_view))).fetchone(),
        }
    # The readers take turns, read by read, so that a load elsewhere on the machine falls on them alike.
    medians: dict[str, dict[str, float]] = {}
    answers: dict[str, dict[str, tuple]] = {}
    for what in readers["plain table"]:
        times: dict[str, list[float]] = {name: [] for name in readers}
        for name, reads in readers.items():
            answers.setdefault(what, {})[name] = tuple(reads[what]())
        for _ in range(args.repeat):
            for name, reads in readers.items():
                started = time.perf_counter()
                reads[what]()
                times[name].append(time.perf_counter() - started)
        for name in readers:
            medians.setdefault(name, {})[what] = statistics.median(times[name])
    files = {name: len(DeltaTable(path).file_uris()) for name, path in
             [("plain table", plain), ("mvsink, table layout", table_view)]
             + ([("plain, overwritten each step", overwritten)] if os.path.isdir(overwritten) else [])
             + ([("mvsink, update layout", updates_view)] if args.with_updates_layout else [])}
    print("\n=== reading the view's latest rows against a plain Delta table of the same rows ===")
    print(f"machine: {machine()}")
    print(f"workload: {args.rows:,}-row view after {args.steps} steps each updating {args.change_fraction:.2%} "
          f"of the rows{' and inserting and deleting a tenth of that' if args.inserts_and_deletes else ''}; "
          "files: " + ", ".join(f"{n} {c}" for n, c in files.items())
          + (f"; the table layout held at most {most_files} files over the run" if most_files is not None
             else "; reads only, of the tables an earlier run left"))
    if write_seconds:
        print("writes per version, p50: " + ", ".join(f"{what} {statistics.median(s):.2f}s"
                                                      for what, s in write_seconds.items()))
    print(f"{'read (median of ' + str(args.repeat) + ')':24}" + "".join(f"{n:>28}" for n in readers))
    same = True
    for what in readers["plain table"]:
        base = medians["plain table"][what]
        cells = "".join(f"{medians[n][what]:>17.3f}s ({medians[n][what] / base:4.2f}x)" for n in readers)
        agree = len(set(answers[what].values())) == 1
        same = same and agree
        print(f"{what:24}{cells}{'' if agree else '  ANSWERS DIFFER: ' + str(answers[what])}")
    if "plain, overwritten each step" in readers:
        print("mvsink against the plain table overwritten at each step (same log length): " + ", ".join(
            f"{what} {medians['mvsink, table layout'][what] / medians['plain, overwritten each step'][what]:.2f}x"
            for what in readers["plain table"]))
    print(f"answers identical: {same}")
    spark.stop()
    return 0 if same else 1


def build(args, spark, source: str, table_view: str, updates_view: str, plain: str, overwritten: str):
    """The source, its ``--steps`` versions, the views following them, the table ``overwritten``
    with the source's rows at every version, and the plain table of the view's rows at the end;
    returns the seconds each layout (and overwrite) took per version and the most files the table
    layout held."""
    from pyspark.sql import functions as F

    from mvsink import ChangesInput, MaterializedView, ViewDefinition
    from deltalake import DeltaTable

    print(f"building a {args.rows:,}-row source in {os.path.dirname(source)} ...", flush=True)
    (spark.range(args.rows)
     .select("id", F.concat(F.lit("customer-"), (F.col("id") % 5000).cast("string")).alias("customer"),
             (F.col("id") % 997).alias("amount"), F.sha1(F.col("id").cast("string")).alias("note"))
     .write.format("delta").option("delta.enableChangeDataFeed", "true")
     .option("delta.enableDeletionVectors", str(args.source_deletion_vectors).lower()).save(source))
    views = [MaterializedView(spark, ViewDefinition("bench", table_view, ChangesInput(source), key=("id",),
                                                    replica_id="bench", deletion_vectors=args.deletion_vectors))]
    if args.with_updates_layout:
        views.append(MaterializedView(spark, ViewDefinition("bench", updates_view, ChangesInput(source), key=("id",),
                                                            replica_id="bench", layout="updates")))
    modulus = int(round(1 / args.change_fraction))
    write_seconds = {f"{v.layout} layout": [] for v in views} | {"overwrite": []}
    most_files = 0
    for i in range(args.steps + 1):
        if i:
            spark.sql(f"UPDATE delta.`{source}` SET amount = amount + {i} WHERE pmod(hash(id, {i}), {modulus}) = 0")
        if i and args.inserts_and_deletes:
            spark.sql(f"DELETE FROM delta.`{source}` WHERE pmod(hash(id, -{i}), {modulus * 10}) = 0")
            batch = max(1, args.rows // (modulus * 10))
            (spark.range(args.rows + i * batch, args.rows + (i + 1) * batch)
             .select("id", F.lit("new").alias("customer"), (F.col("id") % 997).alias("amount"),
                     F.sha1(F.col("id").cast("string")).alias("note"))
             .write.format("delta").mode("append").save(source))
        for view in views:
            started = time.monotonic()
            view.run_until_caught_up()
            if i:
                write_seconds[f"{view.layout} layout"].append(time.monotonic() - started)
        started = time.monotonic()
        spark.read.format("delta").load(source).write.format("delta").mode("overwrite").save(overwritten)
        if i:
            write_seconds["overwrite"].append(time.monotonic() - started)
        most_files = max(most_files, len(DeltaTable(table_view).file_uris()))
        if i % 10 == 0:
            print(f"step {i}: " + ", ".join(f"{what} p50 {statistics.median(s):.2f}s per version"
                                           for what, s in write_seconds.items() if s)
                  + f"; table layout: {len(DeltaTable(table_view).file_uris())} files (at most {most_files})",
                  flush=True)
    spark.read.format("delta").load(table_view).write.format("delta").mode("overwrite").save(plain)
    return write_seconds, most_files


if __name__ == "__main__":
    sys.exit(main())
