"""Long mode: ``python -m tests.differential --minutes N`` (from the project root) runs random
cases until the time is up, shrinks each new kind of failure to a reproduction and prints it,
and ends with the counts: views, times compared, failures by kind and family. Exit status 1 if
any view failed. ``--seed S`` runs the cases S, S+1, ...; the seed of a case printed with a
failure reproduces it (``--seed S --cases 1``)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10, help="run cases until this many minutes have passed")
    parser.add_argument("--seed", type=int, default=None, help="the first case's seed (default: from the clock)")
    parser.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    parser.add_argument("--views", type=int, default=6, help="views per case")
    parser.add_argument("--times", type=int, default=4, help="times of source commits per case")
    parser.add_argument("--shrink-seconds", type=float, default=240, help="budget to shrink each failure")
    args = parser.parse_args(argv)

    os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).parents[1] / "spark-conf"))
    from mvsink.spark import spark_session

    from .runner import Runner, random_case
    from .shrink import reproduction, shrink

    spark = spark_session("mvsink-differential", {"spark.driver.memory": "4g"})
    runner = Runner(spark, Path(tempfile.mkdtemp(prefix="mvsink-differential-")))
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    deadline = time.monotonic() + args.minutes * 60
    cases = views = times = 0
    failed: Counter = Counter()
    shrunk: set[tuple] = set()
    while time.monotonic() < deadline and (args.cases is None or cases < args.cases):
        case = random_case(seed, views=args.views, times=args.times)
        outcome = runner.run(case)
        cases, views, times = cases + 1, views + len(case.views) + len(case.late), times + outcome.times_compared
        print(f"case {seed}: {len(case.views)} views, {outcome.times_compared} times compared, "
              f"{len(outcome.failures)} failed, {outcome.seconds:.0f}s; strategies "
              f"{sorted(set().union(*outcome.strategies.values()))}", flush=True)
        for failure in outcome.failures:
            failed[failure.kind, failure.family] += 1
            print(f"  FAILED view {failure.view} ({failure.family}, {failure.replica}): {failure.kind} at time "
                  f"{failure.time}: {failure.detail}\n    {failure.sql}", flush=True)
            key = (failure.family, *failure.signature)
            if key in shrunk or time.monotonic() > deadline:
                continue
            shrunk.add(key)
            small, found, runs = shrink(runner, case, failure, args.shrink_seconds)
            print(f"--- reproduction (shrunk in {runs} runs) ---\n{reproduction(small, found)}\n---", flush=True)
        seed += 1
    print(f"\n{cases} cases, {views} views, {times} times compared, "
          f"{sum(failed.values())} failures" + "".join(f"\n  {n} {kind}: {family}"
                                                      for (kind, family), n in sorted(failed.items())))
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
