"""Key violations: a key with more than one row at some time puts the view in error there.

For a view with key columns, the error collection holds, for every time `t` and key `k` with
`n > 1` rows in the view at `t`, one error update ``duplicate key {k}: n rows`` (its key columns
set, other user columns null). It is a function of the desired contents, so it is recomputed only
for the keys whose rows changed in a step, and only at the times where they changed.

While a key is violated its rows are *withheld*: stored as updates whose ``_mv_error`` is
:data:`~mvsink.updates.HELD` (every column set) instead of plain rows, so that no reader of the
view's rows (DuckDB, Spark, delta-rs on a table-layout target, :func:`~mvsink.target.read.plain_sql`
on the update layout) ever sees two rows for one key: it sees none, and mvsink's status and
``view_errors`` show the key's error. Where the violation ends, the key's rows are plain rows again
at that time. Which form a row is stored in is a function of the desired contents as well: the
same correction that makes the errors right moves the touched keys' rows between the two forms
(:meth:`KeyErrors.corrections`). A withheld row counts as a row of its key.

Desired contents are not kept separately: `desired = persisted + corrections` (that is what the
correction buffer is), so the state of the touched keys is read from the table's files at the
version the buffer was last reconciled with (the read-back's file list; only those whose
statistics of the key's first column can hold a touched key, where the step knows their ranges:
:attr:`~mvsink.desired.changes.Changes.touched_ranges`) plus the buffer itself. The result is the
correction that makes the buffer's error updates for those keys equal the recomputed error collection.

A hydration into an empty table asks only whether every key has one row (:func:`unique_keys`).
Where the snapshot's partitions hold disjoint key ranges (a table written in key order, the usual
case for ids), each partition answers that for its own rows (:class:`KeyRanges`) and no row is
shuffled; a writing replica has the tasks that stage its files answer it, reading the snapshot once.
"""

from __future__ import annotations

from functools import cache

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink.updates import DIFF, ERROR, HELD, TIME, advance_times, consolidate

_POINT, _N, _NOW, _BEFORE = "_mv_point", "_mv_n", "_mv_now", "_mv_before"
#: How a key violation's error message begins (``duplicate key {"id":1}: 2 rows``).
DUPLICATE_KEY = "duplicate key "
#: Whether the key is violated at a point, and at the point before.
_HELD, _WAS = "_mv_held", "_mv_was_held"
#: The most touched keys that are broadcast to the tasks reading the view's rows, each probing
#: them in memory with no row shuffled (a few MB); more are joined by a sort-merge, which spills.
BROADCAST_KEYS = 200_000


@cache
def key_count_change(key: tuple[str, ...]) -> Column:
    """Over updates partitioned by ``key``: the change of the row's key's row count at the row's
    time (the sum of the ok updates' diffs with that key and time; 0 for error updates and null
    keys, which no count holds). Where it is 0 for every update, no key's count changed, and
    neither did any key violation: an update replacing a row (-old, +new) cannot make or end one.
    Built once per key (an unresolved expression, usable in any plan): a step builds none."""
    ok = F.col(ERROR).isNull() & _all_not_null(list(key))
    net = F.when(ok, F.col(DIFF)).otherwise(F.lit(0).cast("long"))
    return F.sum(net).over(Window.partitionBy(*key, TIME))


class KeyErrors:
    """The key-violation errors of one view (its ``key`` columns, its table ``schema``): the
    updates to add to the correction buffer so that its errors for some keys are right. Its
    Spark expressions are built once, here: a check only composes DataFrames of them."""

    def __init__(self, key: tuple[str, ...], schema: T.StructType):
        self._key, self._columns = list(key), schema.names
        keys = [F.col(k) for k in key]
        self._user = [c for c in schema.names if c not in (ERROR, TIME, DIFF)]
        self._ok = F.col(ERROR).isNull() | (F.col(ERROR) == F.lit(HELD))  # a key's rows, withheld or not
        self._key_error = F.col(ERROR).isNotNull() & (F.col(ERROR) != F.lit(HELD)) & _all_not_null(self._key)
        self._per_time, self._summed = [*keys, F.col(TIME).alias(_POINT)], F.sum(DIFF).alias(_N)
        # A key's row count at time t is the running sum of its diffs up to t (a collection has
        # no negative multiplicities), so one window over (key, time) gives the count at every
        # time where it can change, without joining updates to times.
        by_time = Window.partitionBy(*keys).orderBy(_POINT)
        count = F.sum(_N).over(by_time.rowsBetween(Window.unboundedPreceding, 0))
        message = F.when(count > 1, F.concat(F.lit(DUPLICATE_KEY), F.to_json(F.struct(*keys)), F.lit(": "),
                                             count.cast("string"), F.lit(" rows")))
        self._state = [*keys, F.col(_POINT), message.alias(_NOW)]
        self._changes = [*keys, F.col(_POINT), F.col(_NOW), F.lag(_NOW).over(by_time).alias(_BEFORE)]
        held = F.col(_NOW).isNotNull()
        self._status = [*keys, F.col(_POINT), held.alias(_HELD), F.lag(held, 1, False).over(by_time).alias(_WAS)]
        # Its changes as updates, both from one pass: +message at a point, -previous message.
        now, before = F.col(_NOW), F.col(_BEFORE)

        def error_update(text: Column, diff: int) -> Column:
            values = [(F.col(f.name) if f.name in key else F.lit(None).cast(f.dataType)).alias(f.name)
                      for f in schema.fields if f.name not in (ERROR, TIME, DIFF)]
            return F.struct(*values, text.alias(ERROR), F.col(_POINT).alias(TIME), F.lit(diff).cast("long").alias(DIFF))
        updates = F.array(F.when(now.isNotNull() & ~now.eqNullSafe(before), error_update(now, 1)),
                          F.when(before.isNotNull() & ~before.eqNullSafe(now), error_update(before, -1)))
        self._error_updates = F.inline(F.filter(updates, lambda u: u.isNotNull()))
        self._negated = [(-F.col(DIFF)).alias(DIFF) if c == DIFF else F.col(c) for c in self._columns]

    def _form(self, held: Column) -> Column:
        """The ``_mv_error`` of a row stored while its key is violated (``held``) or not."""
        return F.when(held, F.lit(HELD)).otherwise(F.lit(None).cast("string")).alias(ERROR)

    def corrections(self, persisted: DataFrame, corrections: DataFrame, touched: tuple[DataFrame, int] | None,
                    since: int) -> DataFrame:
        """Updates to add to ``corrections`` so its key-violation errors for ``touched`` keys are right.

        ``persisted``: all updates in the table; ``corrections``: the buffer (times >= ``since``);
        ``touched``: key tuples whose rows changed (repeats allowed) and at most how many distinct
        ones there are (:attr:`~mvsink.desired.changes.Changes.touched`; None: every key, as when hydrating).
        """
        desired = advance_times(persisted.unionByName(corrections), since)
        if touched is not None:
            # Up to BROADCAST_KEYS keys are broadcast: the view's rows are read once and probed,
            # none shuffled. More take a sort-merge join, which spills where a hash join would
            # hold a side's partition in memory whole. The result (the touched keys' rows: few)
            # is kept once for the two uses below, not joined twice.
            keys_frame, count = touched
            hint = "broadcast" if count <= BROADCAST_KEYS else "merge"
            desired = desired.join(keys_frame.hint(hint), on=self._key, how="left_semi").localCheckpoint(eager=False)
        # Shuffled by key once: the grouping by (key, time) and the windows by key are within it.
        rows = desired.where(self._ok).repartition(*self._key)
        state = rows.groupBy(*self._per_time).agg(self._summed).select(*self._state)
        wanted = state.select(*self._changes).select(self._error_updates)
        errors = wanted.unionByName(desired.where(self._key_error).select(*self._negated))
        return errors.unionByName(self._withheld(rows, state.select(*self._status)))

    def _withheld(self, rows: DataFrame, status: DataFrame) -> DataFrame:
        """Updates that store ``rows`` (a key's rows, withheld or not) withheld exactly where
        their key is violated (``status``: per key and point, violated there and before): each
        update of a row in its point's form, and at each point where the key's violation starts
        or ends its rows from before moved to the other form; minus the rows as stored.
        Consolidated: nothing for keys never violated (only those, and keys with a row withheld,
        are looked at)."""
        key, user = self._key, self._user
        affected = (status.where(F.col(_HELD)).select(*key)
                    .unionByName(rows.where(F.col(ERROR) == F.lit(HELD)).select(*key)).distinct())
        mine = rows.join(affected, on=key, how="left_semi")
        plain = mine.select(*user, TIME, DIFF)
        placed = (plain.join(status.select(*key, F.col(_POINT).alias(TIME), _HELD), on=[*key, TIME])
                  .select(*user, self._form(F.col(_HELD)), TIME, DIFF))
        switches = status.where(F.col(_HELD) != F.col(_WAS)).select(*key, _POINT, _HELD)
        before = (plain.join(switches, on=key).where(F.col(TIME) < F.col(_POINT))
                  .groupBy(*user, _POINT, _HELD).agg(F.sum(DIFF).alias(DIFF)).where(F.col(DIFF) != 0))
        moved_in = before.select(*user, self._form(F.col(_HELD)), F.col(_POINT).alias(TIME), DIFF)
        moved_out = before.select(*user, self._form(~F.col(_HELD)), F.col(_POINT).alias(TIME),
                                  (-F.col(DIFF)).alias(DIFF))
        current = mine.select(*self._negated).select(*user, ERROR, TIME, DIFF)
        return consolidate(placed.unionByName(moved_in).unionByName(moved_out).unionByName(current))


def unique_keys(updates: DataFrame, key: tuple[str, ...]) -> tuple[int, bool]:
    """How many ``updates`` there are, and whether each key (nulls equal to nulls) has exactly
    one of them, with diff 1: settled within the partitions where they can
    (:class:`KeyRanges`), else by one Spark job shuffling the key columns only.

    If so, the updates are consolidated (two equal rows share a key) and, at a single time, no
    key has more than one row and none has a negative count: no key violation and nothing to
    consolidate (error rows leave the key columns null, so two of them share the null key).
    """
    settled = unique_keys_in_partitions(updates, key)
    return settled if settled is not None else unique_keys_by_shuffle(updates, key)


def unique_keys_in_partitions(updates: DataFrame, key: tuple[str, ...]) -> tuple[int, bool] | None:
    """:func:`unique_keys`' answer from the partitions' key ranges (:class:`KeyRanges`), in one
    Spark job reading the key and diff columns, shuffling nothing; None if they cannot tell."""
    ranges = KeyRanges.of(updates, key)
    if ranges is None:
        return None
    parts = updates.select(ranges.key, DIFF).mapInArrow(ranges.report_partition, ranges.schema).collect()
    return ranges.settle(parts)


def unique_keys_by_shuffle(updates: DataFrame, key: tuple[str, ...]) -> tuple[int, bool]:
    """:func:`unique_keys`' answer by counting every key: one Spark job shuffling the key columns."""
    per_key = updates.groupBy(*key).agg(
        F.count(F.lit(1)).alias("_mv_n"), F.max(F.col(DIFF) != 1).alias("_mv_odd"))
    total, most, odd = per_key.agg(F.sum("_mv_n"), F.max("_mv_n"), F.max("_mv_odd")).first()
    return total or 0, not total or (most == 1 and not odd)


class KeyRanges:
    """:func:`unique_keys`' answer from each partition's own rows, with nothing shuffled: each
    partition reports its size, whether a key repeats in it or a diff is not 1, its null keys and
    its least and greatest key (:meth:`report_partition`, run in the task that holds the rows: a
    job of its own, or the staging's, which writes the same partitions). A repeat answers no;
    keys unique in every partition, in ranges no two partitions share, with at most one null key
    in all, answer yes; overlapping ranges leave the answer to a shuffle (:meth:`settle`).

    Single-column keys of types whose equality Arrow and Spark share (integers, booleans, dates,
    timestamps, binary-collated strings; not floats, where Spark equates -0.0 and 0.0).
    """

    def __init__(self, key: str, dtype: T.DataType):
        self.key = key
        #: The report of one partition (none for an empty one).
        self.schema = T.StructType([
            T.StructField("n", T.LongType()), T.StructField("repeats", T.BooleanType()),
            T.StructField("nulls", T.LongType()), T.StructField("lo", dtype), T.StructField("hi", dtype)])

    @classmethod
    def of(cls, updates: DataFrame, key: tuple[str, ...]) -> KeyRanges | None:
        """The ranges of ``updates``' key, or None where partitions cannot settle it (see above)."""
        if len(key) != 1:
            return None
        dtype = updates.schema[key[0]].dataType
        if not (isinstance(dtype, (T.IntegralType, T.BooleanType, T.DateType, T.TimestampType))
                or dtype == T.StringType()):
            return None
        return cls(key[0], dtype)

    def report_partition(self, batches):
        """Runs in a Spark task: one partition's batches (with the key and diff columns) -> its
        report row (none if it is empty)."""
        report = self.report()
        for batch in batches:
            report.add(batch)
        if report.rows:
            yield report.batch()

    def report(self) -> _PartitionKeys:
        """A report to fold one partition's batches into."""
        return _PartitionKeys(self.key)

    @staticmethod
    def settle(parts: list) -> tuple[int, bool] | None:
        """:func:`unique_keys`' answer from every non-empty partition's report, None if the
        partitions' key ranges overlap."""
        total = sum(p.n for p in parts)
        if any(p.repeats for p in parts) or sum(p.nulls for p in parts) > 1:
            return total, False
        ranges = sorted((p.lo, p.hi) for p in parts if p.lo is not None)
        if all(hi < lo for (_, hi), (lo, _) in zip(ranges, ranges[1:])):
            return total, True
        return None


class _PartitionKeys:
    """One partition's key column and whether a diff is not 1, folded batch by batch."""

    def __init__(self, key: str):
        self._key, self._keys, self._odd, self.rows = key, [], False, 0

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._keys.append(batch.column(self._key))
            diffs = batch.column(DIFF)
            self._odd = self._odd or bool(pc.any(pc.not_equal(diffs, 1)).as_py())
            self.rows += batch.num_rows

    def values(self) -> dict:
        """The report's columns (one value each) of a non-empty partition."""
        column = pa.chunked_array(self._keys)
        distinct = pc.count_distinct(column, mode="all").as_py()  # a null counts as one value
        bounds = pc.min_max(column)
        return {"n": [len(column)], "repeats": [self._odd or distinct != len(column)],
                "nulls": [column.null_count], "lo": pa.array([bounds["min"].as_py()], column.type),
                "hi": pa.array([bounds["max"].as_py()], column.type)}

    def batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict(self.values())


def _all_not_null(keys: list[str]):
    condition = F.col(keys[0]).isNotNull()
    for k in keys[1:]:
        condition = condition & F.col(k).isNotNull()
    return condition
