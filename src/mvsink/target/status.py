"""A view's state read from its target table and its timeline alone, for ``mvsink status --target``.

No connection to any job is needed, so it works for a stand-alone job as for a controlled one, or
for none: the view's upper and since, the table's version, the timeline's upper and the wall clock
of its latest time, each source's latest version and its lag behind the latest time (in versions
and seconds, :func:`mvsink.metrics.source_lag`), and the view's last commit (version, time, replica,
reason, its range, the foreign commits it repaired, its definition id), the view's fence: the
definition allowed to write it (:mod:`mvsink.append.fence`), and in the table layout the view's
errors at its latest commit.

Invariants: it only reads (delta-rs and the log files, no Spark); a target that is not an mvsink
view, or a view id the table does not know, is a :class:`~mvsink.view.ConfigError` naming it.
"""

from __future__ import annotations

from mvsink.target.commit_info import (META_DEFINITION, META_LOWER, META_REASON, META_REPAIRS, META_REPLICA,
                                       META_UPPER, META_VIEW)
from mvsink.append.fence import fence_of
from mvsink.check import table_at
from mvsink.target.layout import TABLE, error_files, error_messages, layout_of
from mvsink.metrics import source_lag
from mvsink.target.read import newest_first, since_of, view_upper
from mvsink.table import latest_version
from mvsink.timeline import Timeline
from mvsink.view import ConfigError


def table_status(target: str, view_id: str | None = None, timeline: str | None = None) -> dict:
    """The state of view ``view_id`` (default: the view of the table's newest mvsink commit) in
    ``target``, on ``timeline`` (default ``<target>_timeline``), as plain JSON values."""
    if latest_version(target) is None:
        raise ConfigError(f"{target} is not a Delta table (yet): no view has written to it")
    table = table_at(target)
    last = None
    for info in newest_first(table):
        if info.get(META_VIEW) is not None and (view_id is None or info[META_VIEW] == view_id):
            last = info
            break
    if last is None:
        raise ConfigError(f"{target} holds no commit of " + (f"view {view_id!r}" if view_id else "any mvsink view"))
    view_id = last[META_VIEW]
    timeline_path = timeline or f"{target.rstrip('/')}_timeline"
    times = Timeline(timeline_path, None)
    if not times.exists():
        raise ConfigError(f"the timeline {timeline_path} of view {view_id!r} does not exist; give --timeline")
    times.refresh()
    latest = times.last()
    lags = source_lag(times.sources, latest)
    layout = layout_of(target)
    errors = error_messages(target, error_files(last) or []) if layout == TABLE else None
    return {
        "layout": layout,
        # Table layout: the view's error messages at its latest commit (None in the update layout).
        "errors": None if errors is None else sum(errors.values()),
        "error_messages": None if errors is None else sorted(errors)[:5],
        "view_id": view_id,
        "target": target,
        "table_version": table.version(),
        "upper": view_upper(target, view_id),
        "since": since_of(table, view_id),
        "fence": fence_of(table, view_id),
        "timeline": timeline_path,
        "timeline_upper": times.upper,
        "latest_time_minted_at_ms": latest.minted_at if latest is not None else None,
        "sources": {name: {"path": times.sources[name], "latest_version": latest_version(times.sources[name]),
                           "covered_version": latest.versions.get(name) if latest is not None else None,
                           "lag_versions": lag, "lag_seconds": round(seconds, 3)}
                    for name, (lag, seconds) in lags.items()},
        "last_commit": {"version": last.get("version"), "timestamp_ms": last.get("timestamp"),
                        "replica": last.get(META_REPLICA), "reason": last.get(META_REASON),
                        "lower": _int(last.get(META_LOWER)), "upper": _int(last.get(META_UPPER)),
                        "repairs": last.get(META_REPAIRS) or [], "definition": last.get(META_DEFINITION)},
    }


def _int(value) -> int | None:
    return int(value) if value is not None else None
