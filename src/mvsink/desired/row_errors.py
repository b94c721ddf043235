"""Row-level errors: rows the view cannot compute become error updates instead of failing a batch.

Two kinds are caught here, both a deterministic function of the input row, so every replica
produces the same error update, and the update retracts when the input row is fixed (the fix
retracts the bad input row, which retracts the same error):

* the user's ``map_row`` raised, or returned a value that does not fit ``output_schema``
  (a failed cast);
* a key column is null.

An error update keeps the input's time and diff, sets ``_mv_error`` to the message and leaves
the user columns null.
"""

from __future__ import annotations

import json
import sys
from typing import Callable

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from mvsink.updates import DIFF, ERROR, TIME, table_schema


def map_rows(updates: DataFrame, map_row: Callable[[dict], dict | None],
             output_schema: T.StructType) -> DataFrame:
    """``map_row`` applied to each update's row, keeping its time and diff; failures as errors."""
    _ship_by_value(map_row)
    out_schema = table_schema(output_schema)
    arrow_schema = to_arrow_schema(out_schema)
    user_names = output_schema.names
    in_names = [c for c in updates.columns if c not in (TIME, DIFF)]

    def run(batches):
        for batch in batches:
            rows = batch.to_pylist()
            results = []
            for row in rows:
                source_row = {k: row[k] for k in in_names}
                try:
                    mapped = map_row(dict(source_row))
                except Exception as exc:  # the user's function: any failure is an error update
                    results.append(_error_row(user_names, _describe(exc, source_row), row))
                    continue
                if mapped is None:
                    continue
                results.append((mapped, source_row, row))
            yield _to_batch(results, user_names, arrow_schema)

    return updates.mapInArrow(run, out_schema)


def _ship_by_value(function: Callable) -> None:
    """Pickle the user's module with the function, so executors need not be able to import it."""
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    if module is not None and module.__name__ not in ("__main__", "builtins"):
        if "site-packages" not in (getattr(module, "__file__", None) or "site-packages"):
            cloudpickle.register_pickle_by_value(module)


def _describe(exc: Exception, row: dict) -> str:
    return f"{type(exc).__name__}: {exc}; input row {json.dumps(row, default=str, sort_keys=True)}"


def _error_row(user_names, message, row):
    values = {name: None for name in user_names}
    values.update({ERROR: message, TIME: row[TIME], DIFF: row[DIFF]})
    return values, None, None


def _to_batch(results, user_names, arrow_schema: pa.Schema) -> pa.RecordBatch:
    """Build the output batch; a value that does not convert turns its row into an error."""
    rows = []
    for mapped, source_row, row in results:
        if source_row is None:  # already an error row
            rows.append((mapped, None))
            continue
        values = {n: mapped.get(n) for n in user_names}
        values.update({ERROR: None, TIME: row[TIME], DIFF: row[DIFF]})
        missing = [n for n in user_names if n not in mapped]
        if missing:
            error = KeyError(f"map_row result lacks columns {missing}")
            rows.append((_error_row(user_names, _describe(error, source_row), row)[0], None))
        else:
            rows.append((values, (source_row, row)))
    try:
        return pa.RecordBatch.from_pylist([r for r, _ in rows], schema=arrow_schema)
    except _CONVERSION_ERRORS:
        pass  # some row does not fit the schema: find which, one by one
    checked = []
    for values, origin in rows:
        if origin is not None:
            try:
                pa.RecordBatch.from_pylist([values], schema=arrow_schema)
            except _CONVERSION_ERRORS as exc:
                values = _error_row(user_names, _describe(exc, origin[0]), origin[1])[0]
        checked.append(values)
    return pa.RecordBatch.from_pylist(checked, schema=arrow_schema)


_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)


class NullKeyErrors:
    """Ok updates with a null in a column of ``key`` replaced by error updates naming the row.

    Key columns Spark knows to be non-nullable (``NOT NULL`` in the source) hold no null: the
    updates are returned as they are (Spark would fold the check away itself). The expressions
    are built once per schema of updates: a step builds none (each is a round trip to the JVM)."""

    def __init__(self, key: tuple[str, ...]):
        self.key = key
        self._columns: dict[str, list[Column] | None] = {}

    def __call__(self, updates: DataFrame) -> DataFrame:
        schema = updates.schema
        signature = schema.json()
        if signature not in self._columns:
            self._columns[signature] = _null_key_columns(schema, self.key)
        columns = self._columns[signature]
        return updates if columns is None else updates.select(*columns)


def _null_key_columns(schema: T.StructType, key: tuple[str, ...]) -> list[Column] | None:
    """The columns of :class:`NullKeyErrors` over updates of ``schema``; None if no key column
    is nullable."""
    nullable = {f.name: f.nullable for f in schema.fields}
    if not any(nullable[k] for k in key):
        return None
    user = [c for c in schema.names if c not in (ERROR, TIME, DIFF)]
    null_key = reduce_or([F.col(k).isNull() for k in key])
    is_bad = F.col(ERROR).isNull() & null_key
    message = F.concat(
        F.lit(f"null in key column(s) {list(key)} of row "),
        F.to_json(F.struct(*[F.col(c) for c in user]), {"ignoreNullFields": "false"}),
    )
    cols = [F.when(is_bad, F.lit(None)).otherwise(F.col(c)).alias(c) for c in user]
    cols.append(F.when(is_bad, message).otherwise(F.col(ERROR)).alias(ERROR))
    return cols + [F.col(TIME), F.col(DIFF)]


def reduce_or(conditions):
    result = conditions[0]
    for c in conditions[1:]:
        result = result | c
    return result
