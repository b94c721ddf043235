"""The update layout shared by the target table, the correction buffer and the inputs.

A view's target Delta table holds *updates*: the view's user columns plus three columns of
mvsink's own. An update says "at logical time `_mv_time`, add `_mv_diff` copies of this row".
The view at time `t` is the consolidation of every update with `_mv_time <= t`: group by row,
sum the diffs, keep rows whose sum is positive with that multiplicity.

* ``_mv_time`` BIGINT: the logical time; every replica derives it the same way from the input.
* ``_mv_diff`` BIGINT: the multiplicity change, never 0 in what mvsink writes.
* ``_mv_error`` STRING: null for an ok row; for an error update, the message. Error updates carry
  null user columns except the key columns of a key violation.

Rows written behind mvsink's back may leave ``_mv_time``/``_mv_diff`` null; they read as time 0 and
diff +1 (the row is simply present), so that mvsink corrects them like any other drift.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink.view import ConfigError

TIME = "_mv_time"
DIFF = "_mv_diff"
ERROR = "_mv_error"
RESERVED = (ERROR, TIME, DIFF)
#: The ``_mv_error`` of a row withheld from the view's rows while its key has more than one
#: (:mod:`mvsink.desired.key_check`): stored with the errors, its columns all set; not an error.
HELD = "withheld: its key has more than one row"


def is_error() -> Column:
    """Whether an update is an error update (not a row, nor a row withheld: :data:`HELD`)."""
    return F.col(ERROR).isNotNull() & (F.col(ERROR) != F.lit(HELD))

#: The largest time: an upper at CLOSED means the view will never change again.
CLOSED = 2**63 - 1

_UNGROUPABLE = (T.MapType, T.VariantType) if hasattr(T, "VariantType") else (T.MapType,)


def table_schema(user_schema: T.StructType) -> T.StructType:
    """The target table's schema for a view whose rows have ``user_schema``."""
    clash = [f.name for f in user_schema.fields if f.name.lower().startswith("_mv_")]
    if clash:
        raise ConfigError(f"view columns {clash} clash with mvsink's reserved prefix _mv_ (Spark's column names "
                          "are case-insensitive): rename them in the view's query")
    bad = [f.name for f in user_schema.fields if not groupable(f.dataType)]
    if bad:
        raise ConfigError(f"view columns {bad} have map/variant types, which cannot be consolidated")
    fields = [T.StructField(f.name, f.dataType, True) for f in user_schema.fields]
    fields += [
        T.StructField(ERROR, T.StringType(), True),
        T.StructField(TIME, T.LongType(), True),
        T.StructField(DIFF, T.LongType(), True),
    ]
    return T.StructType(fields)


def _contains(dtype: T.DataType, kinds: tuple) -> bool:
    if isinstance(dtype, kinds):
        return True
    if isinstance(dtype, T.StructType):
        return any(_contains(f.dataType, kinds) for f in dtype.fields)
    if isinstance(dtype, T.ArrayType):
        return _contains(dtype.elementType, kinds)
    return False


def user_columns(schema: T.StructType) -> list[str]:
    return [f.name for f in schema.fields if f.name not in RESERVED]


def normalize(df: DataFrame, schema: T.StructType) -> DataFrame:
    """Updates read from the table, in ``schema``'s column order, foreign nulls made explicit."""
    cols = []
    for field in schema.fields:
        if field.name in df.columns:
            col = F.col(field.name).cast(field.dataType)
        else:
            col = F.lit(None).cast(field.dataType)
        if field.name == TIME:
            col = F.coalesce(col, F.lit(0).cast("long"))
        elif field.name == DIFF:
            col = F.coalesce(col, F.lit(1).cast("long"))
        cols.append(col.alias(field.name))
    return df.select(*cols)


def negate(df: DataFrame) -> DataFrame:
    return df.withColumn(DIFF, -F.col(DIFF))


def advance_times(df: DataFrame, frontier: int) -> DataFrame:
    """Times below ``frontier`` moved up to it; the contents at times >= frontier are unchanged."""
    return df.withColumn(TIME, F.greatest(F.col(TIME), F.lit(frontier).cast("long")))


def consolidate(df: DataFrame) -> DataFrame:
    """Updates with equal row and time merged into one, zero diffs dropped."""
    group = [c for c in df.columns if c != DIFF]
    return (
        df.groupBy(*group)
        .agg(F.sum(DIFF).alias(DIFF))
        .where(F.col(DIFF) != 0)
        .select(*df.columns)
    )


def unit_diffs(df: DataFrame) -> DataFrame:
    """Updates with each update of diff ``n`` as ``|n|`` updates of diff 1 or -1 (its sign)."""
    sign = F.signum(DIFF).cast("long")
    return df.withColumn(DIFF, F.explode(F.array_repeat(sign, F.abs(DIFF).cast("int"))))


def groupable(dtype: T.DataType) -> bool:
    """Whether Spark can group by a column of ``dtype`` (no map or variant in it)."""
    return not _contains(dtype, _UNGROUPABLE)


def contents_at(updates: DataFrame, time: int) -> DataFrame:
    """Consolidated rows (user columns and error) at ``time``, one row per copy."""
    rows = [c for c in updates.columns if c not in (TIME, DIFF)]
    summed = (
        updates.where(F.col(TIME) <= F.lit(time))
        .groupBy(*rows)
        .agg(F.sum(DIFF).alias(DIFF))
        .where(F.col(DIFF) > 0)
    )
    return summed.withColumn("_mv_copy", F.explode(F.sequence(F.lit(1), F.col(DIFF).cast("int")))).select(
        *rows
    )
