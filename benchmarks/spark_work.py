"""Where a timed stretch of a benchmark spent its Spark work, read from Spark's event log.

A benchmark run with :func:`event_log_conf` in its session's settings writes the event log
uncompressed to a directory; it marks the stretches it times (wall clock, ``time.time()``, as the
log's timestamps are); after ``spark.stop()`` (which flushes the log), :func:`summaries` says for
each stretch how many Spark jobs ran and for how long (the union of their intervals: two jobs at
once count once), how much of the stretch no job was running (the driver planning, Delta preparing
scans, Python), and Spark's SQL executions by kind, counted and timed (nested ones, such as
Delta's data skipping inside a query's planning, are counted in their own kind and in the one
around them).
"""

from __future__ import annotations

import glob
import json
import os

#: Kinds of SQL executions, by what their description starts with or contains (the first that matches).
KINDS = (("snapshot state", "Compute snapshot"), ("data skipping", "Filtering files for query"),
         ("temp views", "createOrReplaceTempView"), ("held rows", "localCheckpoint"),
         ("Delta operations", "recordDeltaOperation"), ("Arrow reads", "toArrow"), ("collects", "collect at"))


def event_log_conf(directory: str) -> dict[str, str]:
    """Spark settings that write the event log, uncompressed, under ``directory``."""
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": directory, "spark.eventLog.compress": "false"}


def summaries(directory: str, stretches: list[tuple[float, float]]) -> list[str]:
    """One line per stretch ``(start, end)`` (seconds since the epoch) of the newest event log in
    ``directory``: its wall time, its Spark jobs, the time no job ran, its SQL executions by kind."""
    jobs, executions = _events(_newest_log(directory))
    lines = []
    for start, end in stretches:
        begin, finish = start * 1000, end * 1000
        within = sorted((max(s, begin), min(e, finish)) for s, e in jobs if s < finish and e > begin)
        busy, reach = 0.0, begin
        for s, e in within:
            busy += max(0.0, e - max(s, reach))
            reach = max(reach, e)
        kinds: dict[str, list[float]] = {}
        for s, e, description in executions:
            if begin <= s <= finish:
                kinds.setdefault(_kind(description), []).append(min(e, finish) - s)
        parts = ", ".join(f"{kind} {len(times)}x {sum(times) / 1000:.2f}s" for kind, times
                          in sorted(kinds.items(), key=lambda item: -sum(item[1])))
        lines.append(f"{(finish - begin) / 1000:.2f}s: {len(within)} Spark jobs running {busy / 1000:.2f}s, "
                     f"none running {(finish - begin - busy) / 1000:.2f}s; SQL executions: {parts or 'none'}")
    return lines


def _newest_log(directory: str) -> list[str]:
    """The files of the newest event log in ``directory`` (a file, or a rolling log's directory)."""
    newest = max(glob.glob(os.path.join(directory, "*")), key=os.path.getmtime)
    return sorted(glob.glob(os.path.join(newest, "events_*"))) if os.path.isdir(newest) else [newest]


def _events(files: list[str]) -> tuple[list[tuple[float, float]], list[tuple[float, float, str]]]:
    """The jobs ``(submitted, completed)`` and SQL executions ``(start, end, description)`` of the
    log, in milliseconds since the epoch (those that did not end are left out)."""
    job_start, jobs, sql_start, executions = {}, [], {}, []
    for path in files:
        with open(path) as log:
            for line in log:
                event = json.loads(line)
                kind = event["Event"]
                if kind == "SparkListenerJobStart":
                    job_start[event["Job ID"]] = event["Submission Time"]
                elif kind == "SparkListenerJobEnd" and event["Job ID"] in job_start:
                    jobs.append((job_start.pop(event["Job ID"]), event["Completion Time"]))
                elif kind.endswith("SQLExecutionStart"):
                    sql_start[event["executionId"]] = (event["time"], event.get("description", ""))
                elif kind.endswith("SQLExecutionEnd") and event["executionId"] in sql_start:
                    start, description = sql_start.pop(event["executionId"])
                    executions.append((start, event["time"], description))
    return jobs, executions


def _kind(description: str) -> str:
    return next((kind for kind, text in KINDS if text in description), "other")
