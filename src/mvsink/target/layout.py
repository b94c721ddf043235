"""The target's layout: what a reader of the Delta table sees at every version.

A view's target has one of two layouts, fixed when the table is created and recorded in its table
property ``mvsink.layout``:

* ``table`` (the default for a new view): the table holds the view's rows and nothing else: the
  view's columns, a row as often as the view has it. Any Delta reader's ``SELECT *`` is the view
  at its latest time. Every mvsink commit of the view for `[lower, upper)` makes the table the
  view at every time in `[lower, upper)` (a batch never spans a time at which the view changes:
  :meth:`mvsink.sink.MaterializedView._cap`), so Delta time travel to that version reads the view
  at those times (:func:`mvsink.target.read.version_of_time`). A retraction rewrites the files that held
  the row (:mod:`mvsink.write.rewrite`). Error updates (rows the view could not compute, key
  violations) never enter the rows: they are staged under ``_mv_errors/`` in the table directory
  (hidden from Delta readers and VACUUM) and every mvsink commit of the view lists the error files
  in force at its version in its commit info (``mvsink.errors``); the view's errors at a version
  are the consolidation of those files' updates. History is Delta's: a version, once committed,
  reads the same forever, so a foreign write damages the versions after it only, and mvsink's
  repair is the next commit (at a repair time of its own when the sources are idle).
* ``updates``: the table holds updates (the view's columns, ``_mv_error``, ``_mv_time``,
  ``_mv_diff``); the view at time `t` is their consolidation up to `t` (:mod:`mvsink.updates`). It
  keeps every time's contents in the latest version, and a repair rewrites history at every time.
  Readers need mvsink's SQL (:func:`mvsink.target.read.plain_sql`). Tables made before layouts existed
  have no property and the ``_mv_diff`` column: they are this layout.

A view that names no layout takes its target's, or ``table`` for a new one; one that names a
layout its existing target does not have is refused at start, nothing written.
"""

from __future__ import annotations

import json
from collections import Counter

from deltalake import DeltaTable
from pyspark.sql import types as T

from mvsink import storage
from mvsink.table import latest_version
from mvsink.updates import DIFF, ERROR, HELD, RESERVED

TABLE = "table"
UPDATES = "updates"
LAYOUTS = (TABLE, UPDATES)
#: The table property that records a target's layout.
LAYOUT_PROPERTY = "mvsink.layout"
#: Commit-info key of a table-layout commit: the error files in force from its version on.
META_ERRORS = "mvsink.errors"


def stored_schema(layout: str, schema: T.StructType) -> T.StructType:
    """The target table's schema for updates in ``schema``: the view's columns in the table
    layout, all of ``schema`` in the update layout."""
    if layout == TABLE:
        return T.StructType([f for f in schema.fields if f.name not in RESERVED])
    return schema


def layout_of(target: str) -> str | None:
    """The layout of the existing table at ``target`` (None: no table there)."""
    if latest_version(target) is None:
        return None
    table = storage.retrying(f"loading {target}", DeltaTable, storage.delta_uri(target),
                             storage_options=storage.storage_options(target))
    recorded = table.metadata().configuration.get(LAYOUT_PROPERTY)
    if recorded in LAYOUTS:
        return recorded
    return UPDATES if DIFF in [f.name for f in table.schema().fields] else TABLE


def resolve(target: str, wanted: str | None, view_id: str) -> str:
    """The layout a view writes: its target's, else ``wanted``, else ``table``. Raises
    :class:`~mvsink.view.ConfigError` when the target has another layout than ``wanted``."""
    from mvsink.view import ConfigError

    existing = layout_of(target)
    if existing is None:
        return wanted or TABLE
    if wanted is not None and wanted != existing:
        raise ConfigError(
            f"view {view_id!r}: target {target} has the {existing!r} layout, the view asks for "
            f"{wanted!r}; a table's layout cannot change: drop 'layout' (or set it to {existing!r}) "
            f"to keep writing this table, or give the view a new target, which it fills in the "
            f"{wanted!r} layout at its first step")
    return existing


def error_messages(target: str, paths: list[str]) -> Counter:
    """The view's error messages (consolidated, with their multiplicities) in the error files
    ``paths`` of ``target``, read with pyarrow (error files are small: one row per error)."""
    import pyarrow.parquet as pq

    errors: Counter = Counter()
    fs, root = storage.filesystem(target)
    for path in paths:
        with fs.open_input_file(storage.join(root, path)) as f:
            data = pq.read_table(f, columns=[ERROR, DIFF])
        for message, diff in zip(data.column(ERROR).to_pylist(), data.column(DIFF).to_pylist()):
            if message != HELD:  # a row withheld while its key is violated: the violation is the error
                errors[message] += diff
    return +errors


def error_files(info: dict) -> list[str] | None:
    """The error files a table-layout commit's info lists (None: it lists none, not the view's)."""
    value = info.get(META_ERRORS)
    if value is None:
        return None
    return list(json.loads(value)) if isinstance(value, str) else list(value)
