"""Where full evaluation becomes cheaper than maintaining a view from its sources' changes.

Workload: TPC-H at ``--scale`` (default 1) loaded as :mod:`bench_tpch` loads it, one of its views
(``--query``, default ``q3``: the three-way join aggregate). For each change size of ``--sizes``
(orders added and deleted per round, with their lineitems, as fractions of the orders), in
ascending order, ``--rounds`` rounds of TPC-H-like refreshes (:func:`bench_tpch.refresh`); after
each, in the same run, each contender brings its table up to date:

* mvsink ``refresh: incremental`` (its maintained strategy at every size);
* mvsink ``refresh: full`` (the query evaluated at every time, diffed with the last result);
* mvsink ``refresh: auto`` (the default: what it chose is printed, and why where it evaluated in full);
* overwrite (for scale).

Per size it prints the median round of each, the change share that ``auto`` weighs
(:mod:`mvsink.desired.change_size`: the change's bytes over the sources' bytes, from the logs)
and the ratio of maintained to full evaluation; at the end, the smallest share at which full
evaluation was cheaper (the crossover), and whether every contender holds the same rows.

Run: ``python benchmarks/bench_crossover.py [--query q3|q1|...] [--scale 1] [--rounds 2]
[--sizes 0.001,0.005,0.01,0.02,0.05,0.1]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sink import WORKDIR_HELP, fingerprint, machine, work_directory  # noqa: E402
from bench_tpch import QUERIES, caught_up, load, refresh  # noqa: E402

POLICIES = ("incremental", "full", "auto")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--query", choices=sorted(QUERIES), default="q3")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2, help="rounds per change size (default 2)")
    parser.add_argument("--sizes", default="0.001,0.005,0.01,0.02,0.05,0.1",
                        help="orders added and deleted per round, as fractions of the orders")
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    args = parser.parse_args()
    with work_directory(args.workdir, "crossover") as workdir:
        return run(args, workdir)


def run(args, workdir: str) -> int:
    from mvsink import MaterializedView, SnapshotInput, ViewDefinition
    from mvsink.desired.change_size import change_size
    from mvsink.spark import spark_session
    from mvsink.table import latest_version
    from mvsink.target.read import read_view

    sql, key, tables = QUERIES[args.query]
    spark = spark_session("mvsink-bench-crossover")
    sources, sizes = load(spark, args.scale, tables, workdir, False, args.query)
    views = {policy: MaterializedView(spark, ViewDefinition(
        f"{args.query}_{policy}", os.path.join(workdir, f"view_{policy}"), SnapshotInput(sql=sql, refresh=policy),
        key=key, sources=sources, replica_id="bench")) for policy in POLICIES}
    for view in views.values():
        view.run_until_caught_up()
    overwritten = os.path.join(workdir, "overwrite")

    def query():
        session = spark.newSession()
        for name, path in sources.items():
            session.read.format("delta").load(path).createOrReplaceTempView(name)
        return session.sql(sql)

    query().write.format("delta").save(overwritten)
    orders = (sizes["orders"] if "orders" in sizes
              else spark.read.format("delta").load(sources["lineitem"]).select("l_orderkey").distinct().count())
    rows, round_ = [], 0
    for fraction in (float(f) for f in args.sizes.split(",")):
        changed = max(1, int(orders * fraction))
        times, shares, chosen = {name: [] for name in [*POLICIES, "overwrite"]}, [], []
        for _ in range(args.rounds):
            round_ += 1
            before = {name: latest_version(path) for name, path in sources.items()}
            refresh(spark, sources, round_, changed, changed, orders)
            after = {name: latest_version(path) for name, path in sources.items()}
            size = change_size(sources, {n: (before[n] + 1, after[n]) for n in after if after[n] > before[n]}, after)
            shares.append(size.share if size is not None else None)
            for policy, view in views.items():
                started = time.monotonic()
                reports = caught_up(view)
                times[policy].append(time.monotonic() - started)
                if policy == "auto":
                    chosen += [f"{r.strategy} ({r.fallback.kind})" if r.fallback else r.strategy
                               for r in reports if r.strategy]
            started = time.monotonic()
            query().write.format("delta").mode("overwrite").save(overwritten)
            times["overwrite"].append(time.monotonic() - started)
        medians = {name: statistics.median(values) for name, values in times.items()}
        share = statistics.median(s for s in shares if s is not None) if any(s is not None for s in shares) else None
        rows.append((fraction, changed, share, medians, sorted(set(chosen))))
        print(f"{fraction:.1%} of orders ({changed:,} in, {changed:,} out), change share "
              f"{'?' if share is None else f'{share:.2%}'}: "
              + ", ".join(f"{name} {m:.2f}s" for name, m in medians.items())
              + f"; auto took {', '.join(sorted(set(chosen))) or '-'}", flush=True)

    hashes = {policy: fingerprint(read_view(spark, view.view.target, view.view.view_id), query().columns)
              for policy, view in views.items()}
    hashes["overwrite"] = fingerprint(spark.read.format("delta").load(overwritten), query().columns)
    hashes["query"] = fingerprint(query(), query().columns)
    same = len({tuple(h) for h in hashes.values()}) == 1
    print(f"\n=== {args.query} at scale {args.scale}: maintained against full evaluation, by change size ===")
    print(f"machine: {machine()}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    print("| orders in and out per round | change share | incremental | full | incremental / full | auto | "
          "auto took | overwrite |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    crossover = None
    for fraction, changed, share, m, chosen in rows:
        ratio = m["incremental"] / m["full"]
        if crossover is None and ratio > 1 and share is not None:
            crossover = share
        print(f"| {changed:,} ({fraction:.1%}) | {'?' if share is None else f'{share:.2%}'} | {m['incremental']:.2f} s | "
              f"{m['full']:.2f} s | {ratio:.2f} | {m['auto']:.2f} s | {', '.join(chosen) or '-'} | "
              f"{m['overwrite']:.2f} s |")
    print(f"crossover: full evaluation cheaper from a change share of "
          f"{'(none measured)' if crossover is None else f'{crossover:.2%}'}")
    print(f"final contents identical (rows, hash): {same} ({', '.join(f'{n} {h[1]:,}' for n, h in hashes.items())})")
    spark.stop()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
