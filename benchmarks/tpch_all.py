"""Every TPC-H query (Q1-Q22 of :data:`bench_tpch.QUERIES`, no ``ORDER BY``/``LIMIT``; Q3 without its
segment filter) as an mvsink view over one set of tables: the strategy it gets, its first load, each
round's step against the query evaluated alone, and whether the view equals the query after every
round.

Workload: the eight tables from ``tpchgen-cli`` at ``--scale`` (default 0.01), loaded as
:func:`bench_tpch.load` does; the views hydrated; then ``--rounds`` rounds of
:func:`bench_tpch.refresh` (0.1% of the orders come in as new orders with their lineitems, the
oldest 0.1% go), after each of which every view is caught up (timed) and compared with the query
over the same versions by an order-independent hash. "the query" is the query written to a
``noop`` sink: the least any full recomputation (overwrite, MERGE) costs.

Run: ``python benchmarks/tpch_all.py [--scale 0.01] [--rounds 2] [--only q4,q18] [--workdir DIR]``.
Exits 1 if a view differs from its query.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sink import WORKDIR_HELP, fingerprint, machine, work_directory  # noqa: E402
from bench_tpch import QUERIES, TABLES, caught_up, load, refresh  # noqa: E402

#: TPC-H's 22 queries, in its order.
NAMES = tuple(f"q{n}" for n in range(1, 23))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=0.01, help="TPC-H scale factor (default 0.01)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default=",".join(NAMES), help="the queries, comma-separated (default all 22)")
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        parser.error(f"--only: {', '.join(unknown)} not among {', '.join(NAMES)}")
    with work_directory(args.workdir, "tpch-all") as workdir:
        return run(args, names, workdir)


def run(args, names: list[str], workdir: str) -> int:
    from mvsink import MaterializedView, SnapshotInput, ViewDefinition
    from mvsink.spark import spark_session
    from mvsink.target.read import read_view

    spark = spark_session("mvsink-bench-tpch-all")
    sources, sizes = load(spark, args.scale, tuple(TABLES), workdir, False, "all 22")

    def query(name: str):
        session = spark.newSession()
        for table, path in sources.items():
            session.read.format("delta").load(path).createOrReplaceTempView(table)
        return session.sql(QUERIES[name][0])

    views, strategies, seconds, failures = {}, {}, {}, []
    for name in names:
        sql, key, tables = QUERIES[name]
        started = time.monotonic()
        view = MaterializedView(spark, ViewDefinition(name, os.path.join(workdir, f"view_{name}"),
                                                      SnapshotInput(sql=sql), key=key,
                                                      sources={t: sources[t] for t in tables}, replica_id="bench"))
        view.run_until_caught_up()
        views[name] = view
        strategies[name] = view.desired.strategy_description().split(";")[0].split(": ")[0].removeprefix("its query is ")
        seconds[name] = {"load": time.monotonic() - started, "steps": [], "query": []}
        print(f"{name}: loaded in {seconds[name]['load']:.1f}s; {strategies[name]}", flush=True)

    orders = sizes["orders"]
    changed = max(1, int(orders * 0.001))
    for round_ in range(1, args.rounds + 1):
        refresh(spark, sources, round_, changed, changed, orders)
        for name, view in views.items():
            started = time.monotonic()
            reports = caught_up(view)
            seconds[name]["steps"].append(time.monotonic() - started)
            started = time.monotonic()
            query(name).write.format("noop").mode("overwrite").save()
            seconds[name]["query"].append(time.monotonic() - started)
            columns = query(name).columns
            got, expected = (fingerprint(read_view(spark, view.view.target, name), columns),
                             fingerprint(query(name), columns))
            if tuple(got) != tuple(expected):
                failures.append(f"{name} after round {round_}: view {tuple(got)}, query {tuple(expected)}")
            used = ", ".join(sorted({r.strategy for r in reports if r.strategy})) or "-"
            print(f"round {round_} {name}: mvsink {seconds[name]['steps'][-1]:.2f}s ({used}), "
                  f"the query {seconds[name]['query'][-1]:.2f}s, equal {tuple(got) == tuple(expected)}", flush=True)

    print(f"\n=== TPC-H, every query as a view: scale {args.scale}, {args.rounds} rounds of +{changed:,} and "
          f"-{changed:,} orders with their lineitems ===")
    print(f"machine: {machine()}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    print("| query | strategy | first load | mvsink per round (mean) | the query alone (mean) | query ÷ mvsink |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in names:
        steps, alone = seconds[name]["steps"], seconds[name]["query"]
        step, full = sum(steps) / max(1, len(steps)), sum(alone) / max(1, len(alone))
        ratio = f"{full / step:.1f}×" if step >= 0.005 else "no source of it changed"
        print(f"| {name} | {strategies[name]} | {seconds[name]['load']:.1f} s | {step:.2f} s | {full:.2f} s | {ratio} |")
    print(f"views equal to their query after every round: {not failures}")
    for failure in failures:
        print(f"  DIFFERENT: {failure}")
    spark.stop()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
