"""What views cost while nothing changes: the CPU of a driver keeping ``--views`` views caught up
over an idle source, stepped by mvsink's timer (``MaterializedView.start_stream``, what the job
runs) against the same views each driven by a Structured Streaming query (a rate source and
``foreachBatch(mv.foreach_batch)``, the README's other way), in the same run.

Each contender is a process of its own (``--drive loop|stream``, started by this script): one
Spark session, a source of 1,000 rows (change data feed on), ``--views`` views of it (each its own
target and timeline, keyed by ``id``), caught up first; then the CPU time of the process and its
JVM (``/proc/<pid>/stat``, user + system) over ``--seconds`` with no source commit, as a share of
one core, and the steps taken in that window. A step of an idle view reads the target's and the
timeline's latest versions and finds nothing to do; the rest is the driver's and Spark's own.

Run: ``python benchmarks/bench_idle.py [--views 4] [--trigger 0.5] [--seconds 30]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pipeline import Trees  # noqa: E402
from bench_sink import WORKDIR_HELP, machine, work_directory  # noqa: E402

READY = "ready"


def drive(how: str, workdir: str, views: int, trigger: float) -> None:
    """The contender's process: catch the views up, start stepping them, say READY, then step
    until stdin closes; print how many steps ran."""
    from mvsink import ChangesInput, MaterializedView, ViewDefinition
    from mvsink.spark import spark_session

    spark = spark_session(f"bench-idle-{how}")
    source = os.path.join(workdir, "source")
    (spark.range(1000).selectExpr("id", "id * 2 AS v").write.format("delta")
     .option("delta.enableChangeDataFeed", "true").save(source))
    mvs = [MaterializedView(spark, ViewDefinition(f"idle{i}", os.path.join(workdir, f"view{i}"), ChangesInput(source),
                                                  key=("id",), replica_id=how)) for i in range(views)]
    for mv in mvs:
        mv.run_until_caught_up()
    if how == "loop":
        runners = [mv.start_stream(trigger_seconds=trigger) for mv in mvs]
    else:
        runners = [spark.readStream.format("rate").option("rowsPerSecond", 1).load().writeStream
                   .foreachBatch(mv.foreach_batch).trigger(processingTime=f"{trigger} seconds")
                   .option("checkpointLocation", os.path.join(workdir, f"ticks{i}")).start()
                   for i, mv in enumerate(mvs)]
    time.sleep(3 * trigger)  # the first ticks (a streaming query's start) are not idle cost
    before = sum(mv.steps for mv in mvs)
    print(READY, flush=True)
    sys.stdin.read()
    print(sum(mv.steps for mv in mvs) - before, flush=True)
    for runner in runners:
        runner.stop()


def measure(how: str, workdir: str, views: int, trigger: float, seconds: float) -> tuple[float, int]:
    proc = subprocess.Popen([sys.executable, __file__, "--drive", how, "--workdir", workdir, "--views", str(views),
                             "--trigger", str(trigger)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.strip() == READY:
            break
    else:
        raise RuntimeError(f"the {how} process ended before its views caught up (exit {proc.wait()})")
    tree = Trees([proc.pid])
    cpu0, t0 = tree.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    cpu1, t1 = tree.cpu_seconds(), time.monotonic()
    tree.stop()
    proc.stdin.close()
    steps = int(proc.stdout.readline())
    proc.wait()
    return (cpu1 - cpu0) / (t1 - t0), steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--views", type=int, default=4)
    parser.add_argument("--trigger", type=float, default=0.5, help="seconds between steps")
    parser.add_argument("--seconds", type=float, default=30, help="the idle window measured")
    parser.add_argument("--workdir", help=WORKDIR_HELP)
    parser.add_argument("--drive", choices=["loop", "stream"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        return drive(args.drive, args.workdir, args.views, args.trigger)
    print(f"machine: {machine()}")
    print(f"{args.views} idle views, a step every {args.trigger}s, CPU over {args.seconds:.0f}s of each driver "
          "(its Python process and JVM)")
    for how, label in (("loop", "mvsink's timer (start_stream, the job)"),
                       ("stream", "a rate-source streaming query per view + foreachBatch")):
        with work_directory(args.workdir and os.path.join(args.workdir, how), f"idle-{how}") as workdir:
            share, steps = measure(how, workdir, args.views, args.trigger, args.seconds)
        print(f"  {label}: {100 * share:.1f}% of a core, {steps} steps "
              f"({1000 * share * args.seconds / max(steps, 1):.1f} ms of CPU per step, the idle driver's own included)")


if __name__ == "__main__":
    main()
