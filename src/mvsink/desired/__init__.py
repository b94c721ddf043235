"""The desired side: a view's input as updates `(row, time, diff)` at the timeline's times.

Every strategy reads its sources at the versions the timeline pins for each time
(:mod:`mvsink.timeline`), never "whatever is there now", so every replica computes the same
updates at the same times. A view's input is one of:

* :mod:`~mvsink.desired.change_feed`: a source's changes, rows mapped one by one
  (:class:`~mvsink.desired.change_feed.ChangesDesired`);
* :mod:`~mvsink.desired.snapshot`: a query over the sources
  (:class:`~mvsink.desired.snapshot.SnapshotDesired`), whose changes are, by the query's shape
  and its refresh policy (:mod:`~mvsink.desired.refresh`), the query over the source's changes
  (:mod:`~mvsink.desired.row_wise`), its groups moved by them
  (:mod:`~mvsink.desired.linear_aggregate`; under expressions of its aggregates and ``HAVING``,
  :mod:`~mvsink.desired.aggregate_top`; over an outer join, :mod:`~mvsink.desired.outer_join`; over an inner join with a dimension that
  changes, the rest of the join held by its key, :mod:`~mvsink.desired.dimension`), the groups (of one source or of an inner join; or a key
  join's keys) they touch recomputed (:mod:`~mvsink.desired.per_group`; from the aggregate's input
  held in the driver where it is small, :mod:`~mvsink.desired.arrow_recompute`; over a dimension that
  changes, with the rest of the join's rows held by its key, :mod:`~mvsink.desired.arrow_dimension`), each source's changes
  joined with the other sources (:mod:`~mvsink.desired.join`; for a ``UNION ALL``, those of its
  branches; the other sides read from the files :mod:`~mvsink.desired.listed_files` lists where
  it can); where no shape applies, by the delta rules of its plan's operators, composed
  (:mod:`~mvsink.desired.operators`: a window's dedup, joins and aggregates nested in any order);
  or the difference of its full evaluations at consecutive times.

A source's changes come from the files its commits name in the log: their change data files, else
the data files they added and removed (:mod:`~mvsink.desired.log_changes`), feed or no feed; from
Delta's change data feed query where those files do not hold the rows (deletion vectors, column
mapping, a schema change). :mod:`~mvsink.desired.choose` picks the input for a view definition. Every input hands a
step its updates as :class:`~mvsink.desired.changes.Changes` (consolidated, held in Spark,
counted, with the strategy that computed them) and adds row-level errors
(:mod:`~mvsink.desired.row_errors`); the sink checks the updates' keys with
:mod:`~mvsink.desired.key_check` and reports a hydration's progress with
:mod:`~mvsink.desired.hydration`.

This package imports nothing itself: a Spark Python worker running a task of one module (say
:mod:`~mvsink.desired.key_check`) imports only that one.
"""
