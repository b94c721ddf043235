"""Metrics: what each view at a replica has done, in the Prometheus text format, over HTTP.

:class:`ViewMetrics` counts from every step's :class:`~mvsink.sink.StepReport` (steps, commits
won and lost, repairs, failed steps) and keeps the last step's figures (upper, timeline upper,
correction buffer size, duration) and the seconds and Spark jobs spent in each phase of a step.
:func:`render` adds what is read at scrape time: the running hydration (start, elapsed seconds,
Spark tasks done, see :mod:`mvsink.desired.hydration`) and each source's lag behind the view's latest
time (:func:`source_lag`), in versions and in seconds since the oldest source commit the view
does not have yet. :class:`MetricsServer` serves ``GET /metrics`` from a port bound when the
job starts, before Spark: a port in use stops the job at once, with nothing written.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from mvsink import table as delta_table
from mvsink.target.layout import TABLE, error_messages
from mvsink.timeline import Entry
from mvsink.view import ConfigError

log = logging.getLogger(__name__)

#: name -> (type, help) of every metric, in the order they are printed.
METRICS = {
    "mvsink_steps_total": ("counter", "Steps run."),
    "mvsink_step_failures_total": ("counter", "Steps that failed (retried at the next trigger, or fatal)."),
    "mvsink_commits_won_total": ("counter", "Appends this replica committed."),
    "mvsink_commits_lost_total": ("counter", "Appends another replica won first (compare-and-append lost)."),
    "mvsink_repairs_total": ("counter", "Foreign commits repaired by this replica's appends."),
    "mvsink_hydrations_total": ("counter", "Times the view was read whole (start, or after a lost read-back)."),
    "mvsink_compactions_total": ("counter", "Compactions to the retention's since."),
    "mvsink_upper": ("gauge", "The view's upper in the target as last read back."),
    "mvsink_timeline_upper": ("gauge", "The timeline's upper after the last step."),
    "mvsink_correction_updates": ("gauge", "Updates in the correction buffer after the last step."),
    "mvsink_view_errors": ("gauge", "Error rows of the view at the table version last read back (table "
                                    "layout; -1 in the update layout)."),
    "mvsink_step_seconds": ("gauge", "Duration of the last step."),
    "mvsink_read_only": ("gauge", "1 while the replica is read-only."),
    "mvsink_failed": ("gauge", "1 once the view's steps stopped on a failure (its log line at ERROR says why); other views go on."),
    "mvsink_fenced": ("gauge", "1 once another definition of the view holds the fence: this replica never writes again."),
    "mvsink_phase_seconds_total": ("counter", "Seconds spent in each phase of the steps (see mvsink.step_profile)."),
    "mvsink_phase_spark_jobs_total": ("counter", "Spark jobs run in each phase of the steps."),
    "mvsink_steps_by_strategy_total": ("counter", "Steps that computed changes of the view, by how (row-wise, linear "
                                                  "aggregate, per-group recompute, per-key recompute, inner join, "
                                                  "union all, change feed, full evaluation, hydration)."),
    "mvsink_steps_evaluated_in_full_total": ("counter", "Steps of a query view that evaluated the query in full, "
                                                        "by why (policy: refresh full; query: no strategy maintains "
                                                        "it; change share, cost: refresh auto's choice; unreadable: "
                                                        "the sources' changes cannot be read)."),
    "mvsink_steps_in_process_total": ("counter", "Steps of a linear aggregate whose change terms (and maybe groups' "
                                                 "state) were computed in the driver with Arrow, not by Spark "
                                                 "(mvsink.desired.in_process, arrow_groups)."),
    "mvsink_change_share": ("gauge", "The last step's change of a query view against its sources, as a fraction of "
                                     "their bytes (absent until known)."),
    "mvsink_hydrating": ("gauge", "1 while a hydration runs."),
    "mvsink_hydration_started_seconds": ("gauge", "Unix time the running hydration started (0: none runs)."),
    "mvsink_hydration_elapsed_seconds": ("gauge", "Seconds the running hydration has taken so far (0: none runs)."),
    "mvsink_hydration_progress": ("gauge", "Tasks done / tasks of the running hydration's Spark jobs started so far."),
    "mvsink_hydration_last_seconds": ("gauge", "Duration of the last finished hydration."),
    "mvsink_hydration_last_rows": ("gauge", "Updates the last finished hydration left to write (the view's rows, into an empty table)."),
    "mvsink_source_lag_versions": ("gauge", "Source commits not yet covered by the view's latest time."),
    "mvsink_source_lag_seconds": ("gauge", "Age of the oldest source commit not yet covered (0: none)."),
}


@dataclass
class ViewMetrics:
    steps: int = 0
    failures: int = 0
    commits_won: int = 0
    commits_lost: int = 0
    repairs: int = 0
    upper: int = 0
    timeline_upper: int = 0
    corrections: int = 0
    step_seconds: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    phase_spark_jobs: dict[str, int] = field(default_factory=dict)
    strategy_steps: dict[str, int] = field(default_factory=dict)
    full_steps: dict[str, int] = field(default_factory=dict)
    in_process_steps: int = 0
    change_share: float | None = None
    _errors: int = 0
    _errors_of: tuple[str, ...] = ()

    def view_errors(self, mv) -> int:
        """Error rows of ``mv``'s view at the version its read-back last saw (table layout; -1 in
        the update layout), read from its error files once per set of files."""
        if mv.layout != TABLE:
            return -1
        files = tuple(mv.readback.error_files)
        if self._errors_of != files:
            self._errors = sum(error_messages(mv.view.target, list(files)).values())
            self._errors_of = files
        return self._errors

    def record(self, report) -> None:
        """Take in one step's report."""
        self.steps += 1
        self.upper, self.timeline_upper = report.upper, report.timeline_upper
        self.corrections, self.step_seconds = report.corrections, report.seconds
        for phase, seconds in report.phase_seconds.items():
            self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + seconds
            self.phase_spark_jobs[phase] = self.phase_spark_jobs.get(phase, 0) + report.spark_jobs.get(phase, 0)
        if report.strategy:
            self.strategy_steps[report.strategy] = self.strategy_steps.get(report.strategy, 0) + 1
        if report.fallback is not None:
            self.full_steps[report.fallback.kind] = self.full_steps.get(report.fallback.kind, 0) + 1
        if report.change_share is not None:
            self.change_share = report.change_share
        self.in_process_steps += bool(report.in_process)
        if report.appended is True:
            self.commits_won += 1
            self.repairs += report.repairs
        elif report.appended is False:
            self.commits_lost += 1


def render(views: dict) -> str:
    """The Prometheus text of ``views`` (view id -> :class:`~mvsink.sink.MaterializedView`)."""
    samples: dict[str, list[str]] = {name: [] for name in METRICS}
    for view_id, mv in sorted(views.items()):
        labels = f'view="{view_id}",replica="{mv.view.replica_id}"'
        m = mv.metrics
        values = {
            "mvsink_steps_total": m.steps, "mvsink_step_failures_total": m.failures,
            "mvsink_commits_won_total": m.commits_won, "mvsink_commits_lost_total": m.commits_lost,
            "mvsink_repairs_total": m.repairs, "mvsink_hydrations_total": mv.hydrations,
            "mvsink_compactions_total": mv.upkeep.compactions, "mvsink_upper": m.upper,
            "mvsink_timeline_upper": m.timeline_upper, "mvsink_correction_updates": m.corrections,
            "mvsink_step_seconds": m.step_seconds, "mvsink_read_only": int(mv.read_only),
            "mvsink_view_errors": m.view_errors(mv),
            "mvsink_fenced": int(mv.fenced is not None),
            "mvsink_failed": int(mv.failure is not None),
            "mvsink_steps_in_process_total": m.in_process_steps,
            **hydration_values(mv.hydration),
        }
        for name, value in values.items():
            samples[name].append(f"{name}{{{labels}}} {value}")
        for phase, seconds in m.phase_seconds.items():
            phase_labels = f'{labels},phase="{phase}"'
            samples["mvsink_phase_seconds_total"].append(f"mvsink_phase_seconds_total{{{phase_labels}}} {seconds:.3f}")
            samples["mvsink_phase_spark_jobs_total"].append(
                f"mvsink_phase_spark_jobs_total{{{phase_labels}}} {m.phase_spark_jobs[phase]}")
        for strategy, steps in sorted(m.strategy_steps.items()):
            samples["mvsink_steps_by_strategy_total"].append(
                f'mvsink_steps_by_strategy_total{{{labels},strategy="{strategy}"}} {steps}')
        for kind, steps in sorted(m.full_steps.items()):
            samples["mvsink_steps_evaluated_in_full_total"].append(
                f'mvsink_steps_evaluated_in_full_total{{{labels},reason="{kind}"}} {steps}')
        if m.change_share is not None:
            samples["mvsink_change_share"].append(f"mvsink_change_share{{{labels}}} {m.change_share:.6g}")
        for source, (lag, seconds) in source_lag(mv.view.sources, mv.timeline.last()).items():
            source_labels = f'{labels},source="{source}"'
            samples["mvsink_source_lag_versions"].append(f"mvsink_source_lag_versions{{{source_labels}}} {lag}")
            samples["mvsink_source_lag_seconds"].append(
                f"mvsink_source_lag_seconds{{{source_labels}}} {seconds:.3f}")
    lines = []
    for name, (kind, text) in METRICS.items():
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples[name]]
    return "\n".join(lines) + "\n"


def hydration_values(hydration) -> dict[str, float]:
    """The hydration metrics of a :class:`~mvsink.desired.hydration.Hydration`."""
    tasks = hydration.tasks()
    return {
        "mvsink_hydrating": int(hydration.running),
        "mvsink_hydration_started_seconds": round(hydration.started_at or 0.0, 3),
        "mvsink_hydration_elapsed_seconds": round(hydration.elapsed(), 3),
        "mvsink_hydration_progress": round(tasks[0] / tasks[1], 4) if tasks and tasks[1] else 0.0,
        "mvsink_hydration_last_seconds": round(hydration.last_seconds, 3),
        "mvsink_hydration_last_rows": hydration.last_rows,
    }


def source_lag(sources: dict[str, str], last: Entry | None) -> dict[str, tuple[int, float]]:
    """Per source name: the commits past the version the timeline's ``last`` entry covers, and
    the age in seconds of the oldest of them (0 when none)."""
    lags = {}
    for source, path in sorted(sources.items()):
        covered = last.versions.get(source, -1) if last is not None else -1
        latest = delta_table.latest_version(path)
        lag = max(0, (latest if latest is not None else covered) - covered)
        seconds = 0.0
        if lag:
            committed = delta_table.commit_info(path, covered + 1).get("timestamp")
            seconds = max(0.0, time.time() - committed / 1000) if committed else 0.0
        lags[source] = (lag, seconds)
    return lags


class MetricsServer:
    """``GET /metrics`` on ``port`` (all interfaces), rendering ``views()`` at each scrape."""

    def __init__(self, port: int):
        self.views: Callable[[], dict] = dict
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served")
                    return
                try:
                    body = render(server.views()).encode()
                except Exception as exc:  # a scrape never takes the job down
                    log.exception("rendering metrics failed")
                    self.send_error(500, str(exc)[:200])
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        try:
            self.httpd = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        except OSError as exc:
            raise ConfigError(f"metrics port {port} cannot be used: {exc.strerror or exc}") from None
        self.port = self.httpd.server_address[1]

    def start(self, views: Callable[[], dict]) -> None:
        """Serve, in a daemon thread, the views ``views()`` returns."""
        self.views = views
        threading.Thread(target=self.httpd.serve_forever, name="mvsink-metrics", daemon=True).start()
        log.info("metrics on http://0.0.0.0:%d/metrics", self.port)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
