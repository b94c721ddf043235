"""Delta file statistics (numRecords, minValues, maxValues, nullCount) gathered while writing.

Readers skip files by these statistics, so a wrong bound loses rows: a column gets a min/max only
where the value written is exact. Integers, dates, booleans and strings of at most 32 characters
are exact; floats only without NaN; timestamps, decimals and nested columns get no min/max
(Delta's millisecond timestamp bounds would cut off microseconds). Every top-level column gets a
null count.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

_MAX_STRING = 32


def _boundable(dtype: pa.DataType) -> bool:
    return (
        pa.types.is_integer(dtype)
        or pa.types.is_floating(dtype)
        or pa.types.is_date32(dtype)
        or pa.types.is_boolean(dtype)
        or pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
    )


class FileStats:
    """Statistics of one file, folded in batch by batch."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.num_records = 0
        self.null_count = {f.name: 0 for f in schema}
        self.min: dict[str, object] = {}
        self.max: dict[str, object] = {}
        self.unbounded = {f.name for f in schema if not _boundable(f.type)}

    def add(self, batch: pa.RecordBatch) -> None:
        self.num_records += batch.num_rows
        for name, column in zip(batch.schema.names, batch.columns):
            self.null_count[name] += column.null_count
            if name in self.unbounded or column.null_count == len(column):
                continue
            if pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py():
                self.unbounded.add(name)
                continue
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                if pc.max(pc.utf8_length(column)).as_py() > _MAX_STRING:
                    self.unbounded.add(name)
                    continue
            lo, hi = pc.min_max(column).values()
            lo, hi = lo.as_py(), hi.as_py()
            self.min[name] = lo if name not in self.min else min(self.min[name], lo)
            self.max[name] = hi if name not in self.max else max(self.max[name], hi)

    def to_json(self) -> str:
        def bounds(values: dict) -> dict:
            return {k: _json_value(v) for k, v in values.items() if k not in self.unbounded}

        return json.dumps(
            {
                "numRecords": self.num_records,
                "minValues": bounds(self.min),
                "maxValues": bounds(self.max),
                "nullCount": self.null_count,
            }
        )


def _json_value(value: object) -> object:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value
