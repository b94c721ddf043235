"""A query view: the query over its sources at each time's versions, maintained by its shape.

``snapshot(t)`` is the query over the sources at time `t`'s versions; ``changes(lo, hi)`` has
updates at each time whose versions differ from the time before (a time that repeats them, a repair
time, has none). A *row-wise* query (projections and filters of one source,
:mod:`mvsink.desired.row_wise`) is applied to the source's changes
(:func:`mvsink.desired.change_feed.source_changes`: its change data feed, or its commits' added and
removed files, feed or no feed): the work follows the change and no result is kept. A *linear
aggregate* (counts and exact sums grouped by columns, or not grouped, over a row-wise query,
:mod:`mvsink.desired.linear_aggregate`) keeps its groups' state in Spark and moves it by the
aggregates of the source's changes. Another aggregate of one source grouped by its columns (min,
max, distinct counts, percentiles: :mod:`mvsink.desired.per_group`) is recomputed for
the groups the source's changes touch, before and after; so is a *key join* (outer, semi and anti
joins of sources by a key every join equates, or an aggregate over one grouped by the key), for the
keys the sources' changes touch; and an aggregate of a join (inner joins, and outer, semi and anti
joins that pad no source holding the groups) grouped by its sources' columns, for the groups the
join's change touches (the sources that hold no grouping column read
whole, their changes joined with the others to find their groups). A linear aggregate over any
of those keeps its groups' state and moves it by those recomputed rows; one over a linear
aggregate (a rollup) keeps both states, the one below moving the one above. Under expressions of
its aggregates and ``HAVING`` (a row-wise top,
:mod:`mvsink.desired.aggregate_top`), any of these keeps its aggregate's state, and the top maps the
rows that state retracts and adds to the query's (consolidated: a row can be retracted and added). Any other query is evaluated once per such
time, emitting where consecutive results differ: the new result at +1 and the last at -1,
consolidated (each distinct row's count difference, exactly a multiset difference both ways, in one
shuffle); the last result is kept in Spark (a local checkpoint, which spills to disk), never on the
driver. A row-wise or aggregate view whose source's changes cannot be read for a range (a version without change data feed
that has deletion vectors, files gone) is evaluated that way too, from the result before the range.
SQL runs in a session of the view's own, where the sources are registered under their names, so
views never see each other's sources. A query reading ``views`` (a pipeline's views over views) is
given them computed first over the same sources' rows (:func:`with_views`): it stays one query over
the sources at each time, whatever the views are (SQL or Python functions).

An *inner join*, or a *union all* of row-wise queries and inner joins (:mod:`mvsink.desired.join`),
has per source whose version moves one term: the query over its change, the sources joined with it
at their versions before or after, the sources of other branches as no rows; a linear aggregate
over one moves its groups by the same terms. No result is kept. A linear aggregate over an outer
join that its aggregates read as the inner join plus the kept side padded
(:mod:`mvsink.desired.outer_join`) moves its groups by the inner join's terms and the kept side's
changes padded (its padded side's sources given no rows); so does a rollup's aggregate below
over one (TPC-H Q13). A linear aggregate over an inner join with a *dimension* (a source the join
reaches only by its key, whose columns only filter and group: TPC-H Q3's customers) holds, while
the dimension changes, the rest of the join aggregated by the dimension's key
(:mod:`mvsink.desired.dimension`): the dimension's change meets that instead of the other sources,
which a change spread over every key would read whole. Where a step's changes are small, an inner
join's terms, and a linear aggregate's over one or over one source, are computed in the driver
with Arrow (:mod:`mvsink.desired.in_process`, the plan translated by
:mod:`mvsink.desired.arrow_plan`) and reach Spark as a local relation; a step that cannot be
(too large, a source that is not plain Parquet, a value Spark decides) is computed in Spark. An
aggregate with ``min``, ``max`` or ``count(DISTINCT ...)`` over an inner join or one source, whose
input is small, holds that input here and recomputes its changed groups from it
(:mod:`mvsink.desired.arrow_recompute`) where the step's terms are computed here too; over a join
with a dimension, while the dimension changes, it holds the rest of the join's rows by the
dimension's key beside it (:mod:`mvsink.desired.arrow_dimension`).

A query no shape takes is maintained by its plan's operators (:mod:`mvsink.desired.operators`:
each node's delta rule, composed: a ``row_number() ... = 1`` dedup, an aggregate over an anti
join over an aggregate) wherever every node has one and its top is not recomputed whole; only
the rest is evaluated in full. (``shapes = False`` gives every query to the operators: the tests
compare the two.)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from functools import cached_property, reduce
from time import monotonic

import pyarrow as pa
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink import failpoints
from mvsink.correction import checkpointed, held_observing, state_lost
from mvsink.desired.arrow_dimension import ArrowDimension
from mvsink.desired.arrow_groups import MOST_GROUPS, ArrowGroups, Step, arrow_groups
from mvsink.desired.arrow_plan import ArrowPlan, NotEvaluated, NotTranslated, arrow_schema
from mvsink.desired.arrow_recompute import ArrowRecompute, arrow_recompute
from mvsink.desired.change_feed import changes_are_small, source_changes
from mvsink.desired.change_size import ChangeSize, change_size, source_bytes
from mvsink.desired.aggregate_top import RowWiseTop, aggregate_groups
from mvsink.desired.changes import (NET, Changes, SourceRead, delta_file_indexes, delta_reads,
                                    held_changes, touched_ranges, unreadable)
from mvsink.desired.dimension import QUIET_STEPS, DimensionSplit, HeldRest, split_at_dimension
from mvsink.desired.join import (apart_sources, held_names, is_inner_join, is_ranged, join_keys, key_ranges, key_sets,
                                 pruned, ranges_of_column, reads_each_once)
from mvsink.desired.in_process import Declined, InProcessTerms, local_relation
from mvsink.desired.key_check import unique_keys
from mvsink.desired.linear_aggregate import (ROWS, GroupStates, LinearAggregate, aggregate_arguments, aggregate_of_aggregate,
                                             aggregate_of_groups, aggregate_over_outer_join, linear_aggregate,
                                             recomputed_shape)
from mvsink.desired.listed_files import add_actions, files_in_ranges, prunes, read_files, readable
from mvsink.desired.outer_join import inner_joined
from mvsink.desired.per_group import PerGroup, holding_rows_of, in_groups, per_group
from mvsink.desired.refresh import AutoRefresh, Fallback, unmaintained_operator
from mvsink.desired.row_wise import HELD_ROWS, TABLE_SCAN, is_row_wise, passed_through
from mvsink.desired.occurrences import Reads, split_reads
from mvsink.desired.operators import NotMaintained, Operator, operators, time_changes
from mvsink.desired.operators.catalyst import Catalyst
from mvsink.desired.operators.distinct import distinct_keys
from mvsink.desired.sources import Desired
from mvsink.table import spark_uri
from mvsink.timeline import Timeline
from mvsink.updates import DIFF, ERROR, TIME
from mvsink.view import ConfigError, SnapshotInput, ViewDefinition, ViewQuery, sources_named

log = logging.getLogger(__name__)

_MOVED, _SOURCE_KEYS, _FEED_KEYS = "mvsink_moved_groups", "mvsink_source_keys", "mvsink_feed_keys"
_JOINED_GROUPS = "mvsink_joined_groups"
#: The most groups a linear aggregate's state may have to be moved in one task (see
#: :meth:`SnapshotDesired._aggregate_changes`).
ONE_TASK_GROUPS = 100_000
#: The most rows of the rest of a join held by its dimension's keys beside a recomputed aggregate's
#: input (:meth:`SnapshotDesired._hold_inputs_rest`): as many as the input itself may have.
MOST_REST_ROWS = MOST_GROUPS


@dataclass
class SourceFeeds:
    """The changes of a step's sources (:meth:`SnapshotDesired._source_feeds`)."""

    #: Each moving source's changes (its columns, ``TIME``, ``DIFF``), held.
    rows: dict[str, DataFrame]
    #: Whether every change is small (one task holds it).
    small: bool
    #: The ranges of each change's join keys (or grouping columns), by source and column.
    ranges: dict[tuple[str, str], list[tuple]]
    #: Whether each change has a null in the column, by source and column (as ``ranges``).
    nulls: dict[tuple[str, str], bool]
    #: Each change's ``(time, diff)`` pairs that have rows.
    present: dict[str, set[tuple[int, int]]]
    #: The sources' files listed (:meth:`SnapshotDesired._listed`; None: read through Delta), by
    #: source, version and ranges, and what each listing read.
    listed: dict[tuple, list[str] | None] = field(default_factory=dict)
    listed_reads: list[SourceRead] = field(default_factory=list)
    #: The rows of each listing read whole, one DataFrame for the terms that share it (a join's
    #: inserted and deleted rows'), by the same keys.
    listed_rows: dict[tuple, DataFrame] = field(default_factory=dict)
    #: For an aggregate of a join: the groups the changes of its sources read whole touch
    #: (``_group_<i>``, ``TIME``), held; the times they have rows at; per group column, the ranges
    #: covering them and whether one is null (None: not of a type ranges prune). See
    #: :meth:`SnapshotDesired._joined_groups`.
    joined: DataFrame | None = None
    joined_times: set[int] = field(default_factory=set)
    joined_cuts: list[tuple[list[tuple], bool] | None] = field(default_factory=list)


class SnapshotDesired(Desired):
    #: Whether the shapes' strategies are taken where they apply, the operators elsewhere (False:
    #: the operators wherever they maintain the query; the tests run both over the same queries).
    shapes = True

    def __init__(self, spark: SparkSession, view: ViewDefinition, timeline: Timeline):
        assert isinstance(view.input, SnapshotInput)
        self.input: SnapshotInput = view.input
        self._previous: DataFrame | None = None
        self._previous_time: int | None = None
        self._sql_session: SparkSession | None = None
        #: Whether the changes are the query over the source's changes (:mod:`mvsink.desired.row_wise`).
        self.row_wise = False
        #: Whether the changes are the query over each source's change and the other sources
        #: (an inner join, :mod:`mvsink.desired.join`).
        self.join = False
        #: The query's shape if it is a linear aggregate (:mod:`mvsink.desired.linear_aggregate`), its
        #: state (``_state_groups`` groups) at ``_state_time``.
        self.aggregate: LinearAggregate | None = None
        self._groups: GroupStates | None = None
        self._state: DataFrame | None = None
        self._state_time: int | None = None
        self._state_groups = 0
        #: Where the state is moved in this process (:mod:`mvsink.desired.arrow_groups`): how, and
        #: the state as an Arrow table while it is held here (then ``_state`` is None until Spark
        #: needs it: :meth:`_spark_state`), in the types of Spark's (``_state_schema``).
        self._arrow_groups: ArrowGroups | None = None
        self._arrow_groups_refused: str | None = None
        self._state_arrow: pa.Table | None = None
        self._state_schema: T.StructType | None = None
        #: Where the query's aggregates are under expressions or ``HAVING``: its top, which maps the
        #: aggregate's rows to the query's (:mod:`mvsink.desired.aggregate_top`).
        self._top: RowWiseTop | None = None
        #: Where the query is a linear aggregate of a linear aggregate: the one below, its state
        #: (at ``_state_time``, as the one above) and how many groups it had at most.
        self.below: LinearAggregate | None = None
        self._below_groups: GroupStates | None = None
        self._below_state: DataFrame | None = None
        self._below_size = 0
        #: The top of the one below, if it has one (its expressions the one above reads, its HAVING).
        self._below_top: RowWiseTop | None = None
        #: The query's shape if it is a per-group aggregate (:mod:`mvsink.desired.per_group`).
        self.per_group: PerGroup | None = None
        #: Where the query is a linear aggregate over an outer join (:mod:`mvsink.desired.outer_join`):
        #: the sources of its padded side (empty until the held rows name them), given no rows in
        #: the kept side's own terms (``_padded_rows``).
        self.padded: frozenset[str] | None = None
        self._padded_rows: dict[str, DataFrame] = {}
        #: The declared sources the query reads, in the view's order (a pipeline's view declares
        #: every source of the pipeline): the strategies maintain the query over these, and a source
        #: it does not read moves none of its rows (it is given no rows in a step's queries).
        self.read: tuple[str, ...] = ()
        #: The query's text with a name of its own for each read of a source after its first
        #: (:mod:`mvsink.desired.occurrences`): each such name is one more source in ``sources``.
        self._reads = Reads(view.input.sql or "")
        super().__init__(spark, view, timeline)  # sets both from the query's plan (_user_schema)
        held = (self._held_rows() if len(self.read) == 1 or self.join or self.aggregate is not None
                or self.per_group is not None or self.read and self.input.refresh != "full" else None)
        over_held = query_over_held = self._query(held) if held is not None else None
        read_held = {name: held[name] for name in self.read} if held is not None else {}
        self._unread_rows = {name: rows for name, rows in (held or {}).items() if name not in self.read}
        self.row_wise = self.row_wise and over_held is not None and is_row_wise(over_held, HELD_ROWS)
        self.join = (self.join and is_inner_join(over_held, HELD_ROWS, len(self.read))
                     and reads_each_once(over_held, list(read_held.values())))
        #: A row-wise view's key columns as the source's columns they pass on unchanged (None: a
        #: key column is computed, or no key), and whether the source's rows had unique values of
        #: them at a time (``(time, unique)``, None: not known), see :meth:`_source_keys_unique`.
        self._source_key = passed_through(over_held, view.key) if self.row_wise and view.key else None
        self._source_keys_known: tuple[int, bool] | None = None
        if self.per_group is not None:  # its sources named, each read once
            by_rdd = held_names(held)
            if self.aggregate is None:
                self.per_group = per_group(over_held, HELD_ROWS, by_rdd)
            else:  # a linear aggregate over a per-group query: the same aggregate over the held rows
                shape, inner = aggregate_of_groups(over_held, HELD_ROWS, by_rdd, top=True)
                self.aggregate, self.per_group = (shape, inner) if shape == self.aggregate else (None, None)
        elif self.below is not None:  # the same two aggregates over the held rows, the one below reading each once
            below = self.aggregate.aggregate_input(over_held)
            shapes = aggregate_of_aggregate(over_held, HELD_ROWS, len(self.read), top=True)
            padded = _sources_of(shapes[2], held)
            if (shapes[:2] != (self.aggregate, self.below) or (padded is None) != (self.padded is None)
                    or len(self.read) > 1 and not reads_each_once(inner_joined(self.below.core(below)),
                                                                  list(read_held.values()))):
                self.aggregate = self.below = self.padded = None
            else:
                self._below_top = RowWiseTop(below) if self.below.top else None
                core = self._below_top.core if self._below_top is not None else below
                self._below_groups = GroupStates(self.below, core.schema, ())
                self._padded(padded, read_held)
                over_held = inner_joined(core)  # its joins' keys are the ones below (an outer join's the inner's)
        elif self.padded is not None:  # the same over the held rows, its padded side's sources named
            shape, leaves = aggregate_over_outer_join(over_held, HELD_ROWS, len(self.read), top=True)
            padded = _sources_of(leaves, held)
            inner = inner_joined(self.aggregate.core(over_held))
            if shape != self.aggregate or padded is None or not reads_each_once(inner, list(read_held.values())):
                self.aggregate = self.padded = None
            else:
                self._padded(padded, read_held)
                over_held = inner  # its joins' keys are the inner join's
        elif self.aggregate is not None and (
                linear_aggregate(over_held, HELD_ROWS, len(self.read), top=True) != self.aggregate
                or len(self.read) > 1 and not reads_each_once(self.aggregate.core(over_held),
                                                              list(read_held.values()))):
            self.aggregate = None
        elif self.aggregate is not None:
            over_held = self.aggregate.core(over_held)  # its joins' keys are its core's
        #: Why a shape the plan has is not taken (None: none refused), said where the query is evaluated in full.
        self._shape_refused: str | None = None
        if self.per_group is not None and self.per_group.whole:
            self._shape_refused = _read_whole_at_every_read(self._reads, self.per_group.whole)
            if self._shape_refused is not None:
                self.aggregate = self.per_group = None
        #: Where no shape applies: the query's plan as operators that compose (:mod:`mvsink.desired.operators`),
        #: else what it has that none maintains (None: a shape applies, or refresh full).
        self._operators: Operator | None = None
        self._operators_refused: str | None = None
        if not self.shapes:  # the operators alone
            self.row_wise, self.aggregate, self.join, self.per_group, self.below, self.padded = (
                False, None, False, None, None, None)
        if not self._maintained and self._shape_refused is None and held is not None:
            try:
                self._operators = operators(query_over_held, read_held)
            except NotMaintained as exc:
                self._operators_refused = str(exc)
        #: The plan constructors of the view's session, where the operators maintain the query.
        self._catalyst = Catalyst(self.session()) if self._operators is not None else None
        self._apply_refresh_policy()
        weighed = self.input.refresh == "auto" and self._maintained and not self.row_wise
        #: Under ``auto``, whether a step of a maintained query evaluates it in full instead (None: no choice).
        self.auto = AutoRefresh(view.view_id, len(self.read)) if weighed else None
        #: For a join (or an aggregate over one): per source, the other sources it equals columns
        #: with, by which they are pruned to its change's keys (:func:`~mvsink.desired.join.join_keys`).
        by_joins = len(self.read) > 1 and (self.join or self.aggregate) and self.per_group is None
        self._join_keys = join_keys(over_held, read_held) if by_joins else {}
        if self.per_group is not None and self.per_group.whole:  # its whole sources' changes are joined
            query = self._per_group_query(over_held)
            self._join_keys = {name: join_keys(aggregate_groups(holding_rows_of(query, read_held[name])),
                                               read_held).get(name, {}) for name in self.per_group.whole}
        #: For a union all (or an aggregate over one): per source, the sources apart from it (no branch
        #: joins them, :func:`~mvsink.desired.join.apart_sources`), read as no rows (``_no_rows``) in its terms.
        self._apart = apart_sources(over_held, read_held) if by_joins else {}
        self._no_rows = read_held if any(self._apart.values()) else {}
        #: The other sides' reads by source and version (see :meth:`_pinned`), and their files'
        #: add actions where delta-rs lists them (:func:`~mvsink.desired.listed_files.add_actions`).
        self._pinned_reads: dict[tuple[str, int], DataFrame] = {}
        self._add_actions: dict[tuple[str, int], pa.Table | None] = {}
        #: Whether a linear aggregate under a top has a row per key at most (the key holds its groups).
        self._keyed_by_groups = False
        if self.aggregate is not None and self.aggregate.top:  # its state is its core's: no key of the view's
            self._top = RowWiseTop(query_over_held)
            self._groups = GroupStates(self.aggregate, self._top.core.schema, ())
            self._keyed_by_groups = bool(view.key) and self._top.groups_are_keyed(view.key)
        elif self.aggregate is not None:
            self._groups = GroupStates(self.aggregate, self.user_schema, view.key)
        #: Where a linear aggregate over an inner join has a dimension: the rest of its join held
        #: aggregated by the dimension's keys while the dimension changes (:mod:`mvsink.desired.dimension`).
        self._rest: HeldRest | None = None
        #: Seconds of the step so far spent holding the rest (see :meth:`_hold_rest`).
        self._setup_seconds = 0.0
        #: Where an inner join's terms (or a linear aggregate's, over one or over one source) can be
        #: computed in this process (:mod:`mvsink.desired.in_process`): how; None where they cannot.
        self._in_process: InProcessTerms | None = None
        #: What its plan has that is not translated (None: translated, or not such a query).
        self._in_process_refused: str | None = None
        if (self.aggregate is not None and self.per_group is None and self.below is None and not self.padded
                and len(self.read) > 1 and not any(self._apart.values())):
            split = split_at_dimension(over_held, held_names(read_held), aggregate_arguments(over_held),
                                       [o.column if o.expression is not None else None for o in self.aggregate.outputs])
            self._rest = HeldRest(split, self._groups) if split is not None else None
        if ((self.join or self.aggregate is not None and self.per_group is None and self.below is None
             and not self.padded) and not any(self._apart.values())):
            self._in_process = self._terms_in_process(query_over_held, read_held)
        if self._in_process is not None and self.aggregate is not None:
            found = arrow_groups(self.aggregate, self.user_schema, view.key)
            self._arrow_groups, self._arrow_groups_refused = (None, found) if isinstance(found, str) else (found, None)
        #: Where a dimension's steps are computed in this process too (:mod:`mvsink.desired.arrow_dimension`):
        #: how; else what its plans have that is not translated (None: not such a query).
        self._arrow_dimension: ArrowDimension | None = None
        self._arrow_dimension_refused: str | None = None
        if self._rest is not None and self._arrow_groups is not None:
            found = self._dimension_in_process(self._rest.split, self._arrow_groups, self._join_keys, read_held)
            self._arrow_dimension, self._arrow_dimension_refused = ((None, found) if isinstance(found, str)
                                                                    else (found, None))
        #: Where a per-group aggregate's changed groups are recomputed in this process from its input
        #: held here (:mod:`mvsink.desired.arrow_recompute`): how, and its terms; else why not (None:
        #: not such a query). The input held (``_inputs``) is the one at ``_inputs_time``.
        self._recompute: ArrowRecompute | None = None
        self._recompute_terms: InProcessTerms | None = None
        self._recompute_refused: str | None = None
        self._inputs: pa.Table | None = None
        self._inputs_time: int | None = None
        #: Where its input is an inner join with a dimension (:mod:`mvsink.desired.dimension`): how
        #: the dimension's steps move the input here, else why not (None: no dimension); the rest of
        #: the join's multiset held by the dimension's keys while the dimension changes, at
        #: ``_inputs_time`` too, and the steps in a row that did not move the dimension.
        self._recompute_dimension: ArrowDimension | None = None
        self._recompute_dimension_refused: str | None = None
        self._inputs_rest: pa.Table | None = None
        self._rest_quiet = 0
        if self.per_group is not None and self.aggregate is None and not self.per_group.joins:
            self._recompute_in_process(query_over_held, read_held)
        log.info("view %r: %s", view.view_id, self.strategy_description())

    def sources_read(self) -> list[str]:
        """The declared sources its query reads (:attr:`read`, a source read twice once)."""
        return self._reads.declared(self.read)

    def versions(self, time: int) -> dict[str, int]:
        return self._reads.versions(super().versions(time))

    def schema_versions(self) -> dict[str, int]:
        return self._reads.versions(super().schema_versions())

    def strategy_description(self) -> str:
        """The strategy the view's changes get and why, in words (logged at start, and shown
        by ``mvsink explain``), with when ``auto`` evaluates a maintained query in full instead."""
        described = self._shape_words() + self._in_process_words() + self._reads.words()
        if self.auto is None:
            return described
        return (f"{described}; under refresh auto, a step is evaluated in full instead when its change passes "
                f"{self.auto.share_limit:.0%} of its sources' bytes per time, or when full evaluation was cheaper "
                f"(and the maintained step took more than {AutoRefresh.FLOOR:.0f}s per time)")

    def _in_process_words(self) -> str:
        """Where an inner join's or a linear aggregate's terms are computed, in words (none for other strategies)."""
        if self._recompute is not None:
            dimension = ""
            if self._recompute_dimension is not None:
                split = self._recompute_dimension.split
                dimension = (f"; while {split.dimension} changes, the rest of the join's rows are held there by its "
                             f"keys ({split.equalities}), and {split.dimension}'s changes meet them instead of the "
                             "other sources")
            elif self._recompute_dimension_refused is not None:
                dimension = f"; its dimension's changes meet the other sources (its plans have {self._recompute_dimension_refused})"
            return ("; a step whose change is small computes its terms in this process with Arrow and recomputes "
                    "its changed groups there from the aggregate's input held (the steps say so: terms and groups "
                    f"in process), others in Spark (the input held again after them, up to {MOST_GROUPS:,} rows)"
                    f"{dimension}")
        if self._recompute_refused is not None:
            return f"; its changed groups are recomputed in Spark ({self._recompute_refused})"
        if self._in_process is not None and self._arrow_groups is not None:
            dimension = ""
            if self._rest is not None:
                dimension = (f" (while {self._rest.split.dimension} changes too: the rest of the join held here)"
                             if self._arrow_dimension is not None else
                             f" (while {self._rest.split.dimension} changes, in Spark: its plans have "
                             f"{self._arrow_dimension_refused})")
            return ("; a step whose change is small computes its terms and moves its groups' state in this "
                    f"process with Arrow{dimension} (the steps say so: terms and groups in process), others in Spark")
        if self._in_process is not None:
            groups = (f" (its groups' state is moved in Spark: {self._arrow_groups_refused})"
                      if self._arrow_groups_refused else "")
            return ("; a step whose change is small computes its terms in this process with Arrow "
                    f"(the steps say so: terms in process){groups}, others in Spark")
        if self._in_process_refused is not None:
            return f"; its terms are computed in Spark (its plan has {self._in_process_refused})"
        return ""

    def _shape_words(self) -> str:
        """The strategy the query's shape gets and why, in words."""
        if self.row_wise:
            return "its query is row-wise: its changes are the query over the source's changes"
        if self.aggregate is not None and self.per_group is not None and self.per_group.whole:
            return ("its query is a linear aggregate over an aggregate of a join grouped by columns of its "
                    f"sources: its groups are moved by that aggregate's rows of {self._group_words}{self._top_words}")
        if self.aggregate is not None and self.per_group is not None:
            over, touched = (("a key join of its sources (an outer, semi or anti join, or an aggregate grouped by the key)", "keys")
                             if self.per_group.joins else ("an aggregate of one source grouped by its columns", "groups"))
            return (f"its query is a linear aggregate over {over}: its groups are moved by that query's rows of "
                    f"the {touched} the sources' changes touch, recomputed before and after; each source read only "
                    f"where its columns meet the changes' ({self._group_columns}){self._top_words}")
        if self.per_group is not None and self.per_group.whole:
            return f"its query is an aggregate of a join grouped by columns of its sources: {self._group_words}"
        if self.per_group is not None and not self.per_group.joins:
            (columns,) = self.per_group.keys.values()
            return ("its query is an aggregate of one source grouped by its columns: its changes are the groups "
                    "the source's changes touch, recomputed before and after; the source read only where "
                    f"({', '.join(columns)}) meet the change's")
        if self.per_group is not None:
            return ("its query joins its sources by a key that every join equates (an outer join, or an "
                    "aggregate grouped by the key): its changes are the rows of the keys the sources' changes "
                    f"touch, recomputed before and after; each source read only where its key meets the changes' "
                    f"({self._group_columns})")
        if self.aggregate is not None:
            over = ("each source's changes joined with the other sources" if len(self.read) > 1
                    else "the source's changes")
            if self.padded:
                over += (" (its outer join as the inner join plus every row of its kept side padded, the other "
                         f"sources given no rows: the aggregates read only {', '.join(sorted(self.padded))}'s "
                         "columns, none of them count(*))")
            described = (f"its query is a linear aggregate: its changes are its groups' changes from {over}"
                         if self.below is None else
                         "its query is a linear aggregate of a linear aggregate (a rollup): the one below moves its "
                         f"groups by {over}, the one above its groups by the rows the one below retracts and adds"
                         + (" (under its expressions and HAVING)" if self._below_top is not None else ""))
            described += self._top_words
            if self._rest is not None:
                dimension = self._rest.split.dimension
                described += (f"; while {dimension} changes, the rest of the join is held aggregated by its keys "
                              f"({self._rest.split.equalities}), and {dimension}'s changes meet that instead of "
                              "the other sources")
        elif self.join and self._no_rows:
            described = ("its query is a union all (of row-wise queries and inner joins): its changes are each "
                         "source's changes joined with the other sources of its branches")
        elif self.join:
            described = ("its query is an inner join: its changes are each source's changes joined with the "
                         "other sources")
        elif self._operators is not None:
            return ("its query is maintained by the delta rules of its plan's operators, composed: "
                    f"{self._operators.describe()}")
        else:
            return f"its query is evaluated in full at each time ({self._why_full()})"
        pairs = sorted({" = ".join(sorted((f"{name}.{a}", f"{other}.{b}"))) for name, others in self._join_keys.items()
                        for other, columns in others.items() for a, b in columns})
        if pairs:
            described += f"; each other side read only where its join keys meet the change's ({', '.join(pairs)})"
        elif any(len(self._apart.get(name, ())) < len(self.read) - 1 for name in self.read):  # some join
            described += "; the other sides read whole (no equality of plain columns of one type to prune them by)"
        return described

    @property
    def _top_words(self) -> str:
        """What a linear aggregate under a top does with it, in words (nothing without one)."""
        return ("; its expressions of aggregates and filters above them (HAVING) are applied to the groups' rows "
                "retracted and added" if self._top is not None else "")

    @property
    def _group_words(self) -> str:
        """How an aggregate of a join finds and recomputes its changed groups, in words."""
        whole = ", ".join(self.per_group.whole)
        return (f"the groups the sources' changes touch (those of {whole} found by joining their changes with the "
                f"other sources), recomputed before and after; the sources that hold the groups read only where "
                f"their columns meet the changed groups' ({self._group_columns}), {whole} read whole")

    @property
    def _group_columns(self) -> str:
        """The per-group query's columns by source, in words: ``orders.(cust), customers.(cust)``."""
        return ", ".join(f"{name}.({', '.join(columns)})" for name, columns in self.per_group.keys.items())

    @property
    def _aggregate_strategy(self) -> str:
        """A linear aggregate's strategy, as a step reports it."""
        below = (self.per_group.strategy if self.per_group is not None
                 else "linear aggregate" if self.below is not None else None)
        return f"linear aggregate of {below}" if below else "linear aggregate"

    def _why_full(self) -> str:
        """Why the query is evaluated in full: its policy, or what stops every strategy."""
        return self._full_reason.why

    @cached_property
    def _full_reason(self) -> Fallback:
        """Why a step evaluates the query in full where ``auto`` did not choose it: its policy, or
        what stops every strategy (read off its plan once)."""
        if self.input.refresh == "full":
            return Fallback("policy", "refresh full")
        if self._shape_refused is not None:
            return Fallback("query", self._shape_refused)
        if self._operators_refused is not None:
            return Fallback("query", f"it has {self._operators_refused}")
        return Fallback("query", f"it has {unmaintained_operator(self._contents(self.schema_versions()))}")

    def _apply_refresh_policy(self) -> None:
        """``full``: no strategy but full evaluation; ``incremental``: a query that none maintains
        is refused, naming what stops it (:mod:`mvsink.desired.refresh`)."""
        if self.input.refresh == "full":
            self.row_wise, self.aggregate, self.join, self.per_group, self.below = False, None, False, None, None
            self.padded = self._operators = None
        elif self.input.refresh == "incremental" and not self._maintained:
            raise ConfigError(f"view {self.view.view_id!r} has refresh incremental, but its query cannot be "
                              f"maintained from its sources' changes: {self._why_full()}; evaluate it in full "
                              "(refresh auto or full) or change the query")

    @property
    def _maintained(self) -> bool:
        """Whether some strategy computes the changes from the sources' changes."""
        return (self.row_wise or self.join or self.aggregate is not None or self.per_group is not None
                or self._operators is not None)

    def session(self) -> SparkSession:
        """The session the query runs in: for SQL, one of the view's own (its sources' names), with
        two of Spark's optimizations off, both bad for plans made of the query's plan:

        * Runtime bloom filters. The optimizer adds them to a join side whose size it does not
          know (a source with deletion vectors, a change data feed), a Spark job each; the
          strategies take their terms from optimized plans and so stacked them, filters within
          filters: a step over 60 rows ran some 50 jobs in 10-20 s, against 2-4 s without. The
          maintained terms read the other sides already pruned to the change's keys.
        * Constraint propagation. A correlated scalar subquery under an alias gives its projection
          a constraint holding the subquery's join condition, and a ``Union`` over that projection
          (the buffer folding the query's rows in, a step's rows before and after) fails to
          rewrite it (Spark 4.0: ``NoSuchElementException: key not found`` in
          ``UnionBase.rewriteConstraints``): the view could never hydrate. What it infers (null
          checks, filters carried across a join's equality) the terms' explicit key ranges
          already give; no step measured slower without it.
        * For a query with a scalar subquery, pushing a projection through a ``Union``
          (``PushProjectionThroughUnion``, and ``CombineUnions``, which calls it while flattening
          unions; set in :meth:`_user_schema`, once the query is analyzed). With a correlated scalar
          subquery in the projection and a source read as a union of its rows (a late replica's
          step over several times), the projection it pushes names the subquery's column, which
          is not among the union's (Spark 4.0: ``NoSuchElementException: key not
          found`` in ``PushProjectionThroughUnion.pushToRight``): the step's strategy failed and
          it was evaluated in full. ``ColumnPruning`` still prunes each child of a union. Not
          for every query: without ``CombineUnions`` a ``UNION`` of three stays two nested
          ``DISTINCT`` aggregates, which no strategy maintains."""
        if self.input.sql is None:
            return self.spark
        if self._sql_session is None:
            self._sql_session = self.spark.newSession()
            self._sql_session.conf.set("spark.sql.optimizer.runtime.bloomFilter.enabled", "false")
            self._sql_session.conf.set("spark.sql.constraintPropagation.enabled", "false")
        return self._sql_session

    def _contents(self, versions: dict[str, int], given: dict[str, DataFrame] | None = None) -> DataFrame:
        """The query over the sources at ``versions``, those in ``given`` given those rows instead."""
        given = given or {}
        return self._query({n: given[n] if n in given else self.read_source(n, versions[n], self.session())
                            for n in self.sources})

    def _query(self, sources: dict[str, DataFrame]) -> DataFrame:
        """The query over ``sources`` (name -> rows, in :meth:`session`)."""
        where = f"view {self.view.view_id!r}"
        try:
            if self.input.views:
                sources = with_views(sources, self.input.views)
            if self.input.sql is not None:
                for name, rows in sources.items():
                    rows.createOrReplaceTempView(name)
                result = self._sql_session.sql(self._reads.sql)
            elif self.input.source is not None:
                (rows,) = sources.values()  # one unnamed source: the function takes it alone
                result = self.input.query(rows)
            else:
                result = self.input.query(**sources_named(self.input.query, sources))
        except ParseException as exc:
            raise ConfigError(f"{where}: its SQL does not parse: {_first_line(exc)}") from None
        except AnalysisException as exc:
            message = _first_line(exc)
            if "TABLE_OR_VIEW_NOT_FOUND" in message:
                raise ConfigError(f"{where}: its query reads a table that is not one of its sources "
                                  f"{sorted(self.view.sources)}: {message}") from None
            raise ConfigError(f"{where}: its query cannot be analyzed: {message}") from None
        except TypeError as exc:
            raise ConfigError(f"{where}: its query function cannot be called with the sources "
                              f"{sorted(self.view.sources)} by name: {exc}") from None
        if not isinstance(result, DataFrame):
            raise ConfigError(f"query of {where} returned {type(result).__name__}, not a DataFrame")
        return result

    def _user_schema(self) -> T.StructType:
        if self.input.sql is not None:
            self._reads = split_reads(self.session(), self.input.sql, self.sources)
            self.sources = self._reads.paths(self.sources)
        versions = self.schema_versions()
        rows = {name: self.read_source(name, versions[name], self.session()) for name in self.sources}
        result = self._query(rows)
        if self.input.sql is not None and _has_scalar_subquery(result):
            # before any of the view's plans is optimized: all are optimized alike
            _exclude_rules(self.session(), _UNION_PUSHDOWN_RULES)
        #: Whether the query's plan has no two rows of the view's key at any time (a grouping or a
        #: dedup by key columns, :mod:`~mvsink.desired.operators.distinct`).
        self._key_distinct = bool(self.view.key) and any(keys <= set(self.view.key) for keys in distinct_keys(result))
        read = _delta_tables(result)
        self.read = tuple(name for name, frame in rows.items() if _delta_tables(frame, analyzed=True) & read)
        self.row_wise = len(self.read) == 1 and is_row_wise(result, TABLE_SCAN)
        self.join = len(self.read) > 1 and is_inner_join(result, TABLE_SCAN, len(self.read))
        self.aggregate = linear_aggregate(result, TABLE_SCAN, len(self.read), top=True) if self.read else None
        if self.aggregate is None and len(self.read) > 1:
            self.aggregate, padded = aggregate_over_outer_join(result, TABLE_SCAN, len(self.read), top=True)
            self.padded = frozenset() if padded is not None else None
        if self.aggregate is None and not self.join:
            self.per_group = per_group(result, TABLE_SCAN)
            if self.per_group is not None and self.per_group.whole:
                # An aggregate of a join recomputes whole groups (TPC-H Q4's five read every file);
                # a linear one over a key join (a semi join's EXISTS) moves by the changed keys' rows.
                shape, inner = aggregate_of_groups(result, TABLE_SCAN, top=True)
                if inner is not None and inner.joins:
                    self.aggregate, self.per_group = shape, inner
        if self.aggregate is None and self.per_group is None and not self.join and self.read:
            self.aggregate, self.below, padded = aggregate_of_aggregate(result, TABLE_SCAN, len(self.read), top=True)
            self.padded = frozenset() if padded is not None else None
            if self.aggregate is None:
                self.aggregate, self.per_group = aggregate_of_groups(result, TABLE_SCAN, top=True)
        return result.schema

    def _padded(self, padded: frozenset[str] | None, read_held: dict[str, DataFrame]) -> None:
        """Names the outer join's padded side's sources (None: it has none), given no rows in the
        kept side's terms."""
        self.padded = padded
        self._padded_rows = {name: read_held[name] for name in padded or ()}

    def _held_rows(self) -> dict[str, DataFrame]:
        """Rows held in Spark (none) for each source, in its columns: the query over them, where
        it has the shape it has over the sources, reads what it is given, not a table itself,
        and can be applied to the sources' changes."""
        versions = self.schema_versions()
        return {name: self.read_source(name, versions[name], self.session()).limit(0).localCheckpoint(eager=True)
                for name in self.sources}

    def _result_at(self, time: int) -> DataFrame:
        """The query's result over the sources at ``time``'s versions, in the view's columns."""
        return self._contents(self.versions(time)).select(*self.user_schema.names)

    def _remember(self, time: int, contents: DataFrame) -> None:
        self._previous = contents.localCheckpoint(eager=True)
        self._previous_time = time

    def _as_updates(self, rows: DataFrame, time: int | None = None, diff: int | None = None) -> DataFrame:
        """``rows`` (the view's columns) as ok updates at ``time`` with ``diff`` (None: the
        rows' own ``TIME``, ``DIFF`` column)."""
        return rows.select(
            *self.user_schema.names, F.lit(None).cast("string").alias(ERROR),
            (F.col(TIME) if time is None else F.lit(time).cast("long")).alias(TIME),
            (F.col(DIFF) if diff is None else F.lit(diff).cast("long")).alias(DIFF),
        )

    def snapshot(self, time: int) -> DataFrame:
        if self.aggregate is not None:  # its groups' state, held: the next changes move it
            self._hold_state(time)
            contents = self._state_result()
        elif self._recompute is not None and self._hold_inputs(time):
            contents = self._recomputed_result()
        elif self.row_wise or self.join or self.per_group is not None or self._operators is not None:
            contents = self._result_at(time)
        else:  # kept: the next changes are the difference to it
            self._remember(time, self._result_at(time))
            contents = self._previous
        return self._finish(self._as_updates(contents, time, 1))

    def _state_is_at(self, time: int) -> bool:
        """Whether a linear aggregate's groups' state is held at ``time`` (set only with the state)."""
        return self._state_time == time

    def _state_result(self) -> DataFrame:
        """The query's result at the time of the groups' state held: its groups' output rows."""
        return _through(self._top, self._groups.output(self._spark_state())).select(*self.user_schema.names)

    def _hold_state(self, time: int) -> None:
        """The aggregate's state at ``time`` (and the one below's), from the sources at its versions,
        held. Over a join with a dimension whose rest is held (at another time), the rest is held
        at ``time`` first and the state is the dimension's rows joined with it
        (:meth:`HeldRest.groups_state`): the same reads. A hydration holds no rest: the first step
        where the dimension moves holds it, and until then the steps' terms are computed as any
        join's (in this process where they can be)."""
        versions = self.versions(time)
        if self._rest is not None and self._rest.time is not None:  # the state from the rest (no padding, no below)
            self._hold_rest(time)
            dimension = self._rest.split.dimension
            state = self._rest.groups_state(self._pinned(dimension, versions[dimension]))
        else:
            contents = ([inner_joined(self._contents(versions)), self._contents(versions, self._padded_rows)]
                        if self.padded  # the inner join plus the kept side padded (its padded side given no rows)
                        else [self._contents(versions)])
            parts = [self.aggregate.aggregate_input(rows) for rows in contents]
            if self.below is not None:  # the outer join is the one below's, if there is one
                self._below_state, self._below_size = checkpointed(
                    self._below_groups.state(*[self.below.aggregate_input(rows) for rows in parts]))
                parts = [_through(self._below_top, self._below_groups.output(self._below_state))]
            state = self._groups.state(*parts)
        (self._state, self._state_groups), self._state_time = checkpointed(state), time
        self._state_arrow = None

    def _spark_state(self) -> DataFrame:
        """The groups' state held, as a Spark DataFrame (a local relation where it is held here)."""
        if self._state is None:
            self._state = local_relation(self.session(), self._state_arrow, self._state_schema)
        return self._state

    def _arrow_state(self) -> pa.Table | None:
        """The groups' state held, as an Arrow table (collected once from Spark where it was
        held there); None where it has more than :data:`MOST_GROUPS` groups (logged: Spark moves it)."""
        if self._state_arrow is None:
            if self._state_groups > MOST_GROUPS:
                log.info("view %r: its groups' state is moved by Spark: more than %d groups", self.view.view_id,
                         MOST_GROUPS)
                return None
            self._state_schema = self._state.schema
            self._state_arrow = self._state.toArrow()
        return self._state_arrow

    @property
    def snapshot_is_stored(self) -> bool:
        # a query (row-wise, join, per-group) over pinned versions, the query's checkpointed result, or its
        # groups' held state
        return True

    def changes(self, lo: int, hi: int) -> Changes | None:
        """The updates at each time in `[lo, hi]` whose versions differ from the time before."""
        times = [t for t in range(lo, hi + 1) if self.versions(t) != self.versions(t - 1)]
        if not times:
            return None
        strategy, from_feed = (("row-wise", self._row_wise_changes) if self.row_wise
                               else (self._aggregate_strategy, self._aggregate_changes) if self.aggregate is not None
                               else ("union all" if self._no_rows else "inner join", self._join_changes) if self.join
                               else (self.per_group.strategy, self._per_group_changes) if self.per_group is not None
                               else ("operators", self._operator_changes) if self._operators is not None
                               else (None, None))
        size = self._change_size(times) if from_feed is not None else None
        share = size.share if size is not None else None
        fallback = self.auto.full_instead(size, len(times)) if self.auto is not None else None
        if from_feed is not None and fallback is None:
            started, self._setup_seconds = monotonic(), 0.0
            try:
                changes = replace(from_feed(times), strategy=strategy, change_share=share)
                failpoints.hit("maintained-changes")
            except Exception as exc:
                fallback = self._failed(exc, lo, hi)
            else:
                if self.auto is not None:
                    self.auto.observed(False, monotonic() - started - self._setup_seconds, len(times))
                return self._keys_distinct(changes)
        if fallback is None:
            fallback = self._full_reason
        if fallback.kind in ("unreadable", "change share"):
            log.warning("view %r: times %d..%d evaluated in full: %s", self.view.view_id, lo, hi, fallback)
        started = monotonic()
        changes, evaluations = self._recomputed_changes(times)
        changes = replace(changes, strategy="full evaluation", change_share=share, fallback=fallback)
        if self.auto is not None:
            self.auto.observed(True, monotonic() - started, evaluations)
        return self._keys_distinct(changes)

    def _keys_distinct(self, changes: Changes) -> Changes:
        """``changes`` with no key count changing where the query's plan has no two rows of one
        key (:attr:`_key_distinct`): no key violation can start or end, no key check runs."""
        return replace(changes, key_counts_change=False) if self._key_distinct and changes.key_counts_change else changes

    def _failed(self, exc: Exception, lo: int, hi: int) -> Fallback:
        """Why times ``lo``..``hi``, whose maintained step raised ``exc``, are evaluated in full:
        their sources' changes cannot be read, or the strategy failed (logged with ``exc``; what
        the strategies hold is dropped, as the failed step may have moved part of it). A
        configuration error (a fence among them), a cancelled job (a stop) or held state lost with
        an executor (the sink hydrates again) is raised: full evaluation would not help."""
        reason = unreadable(exc)
        if reason is not None:
            return Fallback("unreadable", f"the changes of its sources cannot be read ({reason})")
        if isinstance(exc, ConfigError) or state_lost(exc) or _cancelled(exc):
            raise exc
        log.warning("view %r: times %d..%d evaluated in full: its strategy failed: %s: %s", self.view.view_id,
                    lo, hi, type(exc).__name__, _first_line(exc), exc_info=exc)
        self._drop_held()
        return Fallback("failed", f"its strategy failed ({type(exc).__name__}: {_first_line(exc)[:300]})")

    def _drop_held(self) -> None:
        """Forget what the strategies hold from one step to the next: a linear aggregate's groups'
        state (and the one below's), the rest of its join held by its dimension's keys, a
        recomputed aggregate's input held here, whether the source's keys were unique. The next
        maintained step holds them again, from the sources at the time before it."""
        self._state = self._state_time = self._state_arrow = self._below_state = None
        self._inputs = self._inputs_rest = self._inputs_time = None
        self._source_keys_known = None
        if self._rest is not None:
            self._rest.time = None

    def _change_size(self, times: list[int]) -> ChangeSize | None:
        """The change at ``times`` in bytes against the sources' bytes after it
        (:mod:`~mvsink.desired.change_size`), the sources' sizes from the add actions a join's
        other sides are listed by where delta-rs lists them (:meth:`_listed` uses them again;
        those of versions below the step's are dropped)."""
        before, after = self.versions(times[0] - 1), self.versions(times[-1])
        self._add_actions = {(name, version): actions for (name, version), actions in self._add_actions.items()
                             if version >= before[name]}

        def size(name: str, version: int) -> int | None:
            if (name, version) not in self._add_actions:
                self._add_actions[name, version] = add_actions(self.sources[name], version)
            actions = self._add_actions[name, version]
            if actions is None:
                return source_bytes(self.sources[name], version)
            return sum(file_bytes or 0 for file_bytes in actions.column("size_bytes").to_pylist())

        moved = {name: (before[name] + 1, after[name]) for name in self.read if after[name] > before[name]}
        return change_size(self.sources, moved, {name: after[name] for name in self.read}, size)

    def hydrated(self, seconds: float) -> None:
        if self.auto is not None:
            self.auto.hydrated(seconds)

    def _previous_is_before(self, time_: int) -> bool:
        """Whether the result kept is that of the time before ``time_``."""
        return self._previous is not None and self._previous_time == time_ - 1

    def _feed(self, times: list[int], name: str | None = None) -> tuple[DataFrame, int, int]:
        """Source ``name``'s changes (the one source's by default) at those of ``times`` that
        move its version (lazy; the query is applied to rows held in Spark, as its shape was
        checked), and its first and last source versions."""
        if name is None:
            (name,) = self.read
        spans = [(t, self.versions(t - 1)[name] + 1, self.versions(t)[name]) for t in times]
        spans = [span for span in spans if span[1] <= span[2]]
        first, last = spans[0][1], spans[-1][2]
        return source_changes(self.session(), self.sources[name], spans, first, last), first, last

    def _join_changes(self, times: list[int]) -> Changes:
        """The terms of the query's change at each time (:meth:`_change_terms`), from each
        source's changes held, consolidated."""
        computed = self._terms_here(times) if self._in_process is not None else None
        in_process = self._terms_by_time(computed[0]) if computed is not None else None
        if in_process is not None:  # small: the terms computed here, their rows a local relation
            terms, listed = in_process, computed[1]
            parts = [self._as_updates(rows, time, diff) for (time, diff), rows in terms.items()]
            few = True
        else:
            feeds = self._source_feeds(times)
            parts = [self._as_updates(result, time, diff)
                     for time in times for diff, result in self._change_terms(time, feeds)]
            listed, few = feeds.listed_reads, feeds.small
        updates = self._finish(reduce(DataFrame.unionByName, parts)) if parts else self._no_updates()
        changes = held_changes(updates, times[0], self.view.key, reads=in_process is None, few=few)
        return replace(changes, reads=self._named(changes.reads + tuple(listed)),
                       in_process="terms" if in_process is not None else "")

    def _operator_changes(self, times: list[int]) -> Changes:
        """Per time, the operators' rows added and removed (:mod:`mvsink.desired.operators`), from
        the changes of the sources that move, held once for the step; consolidated."""
        before, after = self.versions(times[0] - 1), self.versions(times[-1])
        self._pinned_reads = {key: rows for key, rows in self._pinned_reads.items() if key[1] >= before[key[0]]}
        feeds = {name: self._feed(times, name)[0].localCheckpoint(eager=True)
                 for name in self._operators.sources if after[name] != before[name]}
        found, setup = time_changes(self._operators, self._catalyst, times, self.versions, self._pinned, feeds)
        self._setup_seconds += setup
        parts = [self._as_updates(rows, time, diff) for time, plus, minus in found
                 for rows, diff in ((plus, 1), (minus, -1))]
        updates = self._finish(reduce(DataFrame.unionByName, parts)) if parts else self._no_updates()
        changes = held_changes(updates, times[0], self.view.key, reads=True)
        return replace(changes, reads=self._named(changes.reads))

    def _no_updates(self) -> DataFrame:
        """No updates, in the table schema."""
        return self.spark.createDataFrame([], self.schema)

    def _named(self, reads: tuple[SourceRead, ...]) -> tuple[SourceRead, ...]:
        """``reads`` with each source's table named by the view's name for it."""
        paths = {_table_path(spark_uri(path)): name for name, path in self.view.sources.items()}
        return tuple(replace(read, table=paths.get(_table_path(read.table), read.table)) for read in reads)

    def _source_feeds(self, times: list[int]) -> SourceFeeds:
        """Each source's changes at ``times`` (of those whose version moves), held (read once
        for all the times), and where several sources are joined, a small change broadcast to
        the joins; whether every change is small; the ranges of each change's join keys (by
        source and column) the other sides are read in (:func:`~mvsink.desired.join.key_ranges`;
        for a per-group aggregate, of its grouping columns, by which the source is read) and
        whether each has a null; and the times and diffs each change has rows at. What is known of
        a change is observed by the Spark job that holds it (a small change's join keys too). For an
        aggregate of a join, also the groups the changes of its sources read whole touch
        (:meth:`_joined_groups`)."""
        feeds = SourceFeeds({}, True, {}, {}, {})
        before = self.versions(times[0] - 1)
        self._pinned_reads = {(name, version): rows for (name, version), rows in self._pinned_reads.items()
                              if version >= before[name]}
        for name in self.read:
            if all(self.versions(t - 1)[name] == self.versions(t)[name] for t in times):
                continue
            feed, first, last = self._feed(times, name)
            is_small = changes_are_small(self.sources[name], first, last)
            columns = self._ranged_columns(name, feed.schema)
            observed = [F.to_json(F.collect_set(F.array(TIME, DIFF))), *(F.max(F.col(c).isNull()) for c in columns),
                        *(key_sets(columns) if is_small else [])]
            held, (present, *found) = held_observing(feed, f"{_FEED_KEYS}_{len(feeds.rows)}", *observed)
            nulls, sets = found[:len(columns)], found[len(columns):]
            feeds.nulls.update({(name, column): bool(null) for column, null in zip(columns, nulls)})
            feeds.rows[name] = F.broadcast(held) if is_small and len(self.read) > 1 else held
            feeds.present[name] = {tuple(pair) for pair in json.loads(present)}
            feeds.small = feeds.small and is_small
            if columns:
                feeds.ranges.update({(name, column): cut for column, cut
                                     in key_ranges(held, columns, sets if is_small else None).items()})
        if self.per_group is not None and self.per_group.whole:
            self._joined_groups(times, feeds)
        return feeds

    def _ranged_columns(self, name: str, schema: T.StructType) -> list[str]:
        """Source ``name``'s columns (of ``schema``) whose values in its change prune reads by
        their ranges: its join keys (the other sides' reads), or a per-group aggregate's grouping
        columns of a type ranges prune (the source's own reads)."""
        if self.per_group is not None and name in self.per_group.keys:
            return [c for c in self.per_group.keys[name] if is_ranged(schema[c].dataType.simpleString())]
        return sorted({column for pairs in self._join_keys.get(name, {}).values() for column, _ in pairs})

    def _change_terms(self, time: int, feeds: SourceFeeds, of: tuple[str, ...] | None = None,
                      padded: frozenset[str] = frozenset(), rest: DimensionSplit | None = None
                      ) -> list[tuple[int, DataFrame]]:
        """The query's change at ``time`` as terms ``(diff, result)``: per source whose version
        moves, the query over its inserted rows (+1) and its deleted rows (-1) and the other
        sources, those before it (in the view's order) at the time's versions, those after it
        at the versions before, each read only where its join keys lie in the ranges of the
        change's keys (:mod:`mvsink.desired.join`; ``feeds.ranges`` holds them by source and
        column, cut once for all the times of the feeds by :meth:`_source_feeds`; one source: the
        query over its change alone); the sources apart from it in a union all as no rows.
        A change none of whose rows has a key to join by has no term: its rows join nothing; nor
        has a change with no inserted (or no deleted) rows at ``time`` a term for them. With ``of``,
        only those sources' terms; the sources ``padded`` have none, and are given no rows in the
        others' (an outer join's kept side padded, :mod:`mvsink.desired.outer_join`). With ``rest``,
        the terms of the join without its dimension (:meth:`~mvsink.desired.dimension.DimensionSplit.rest_rows`),
        the dimension neither read nor given a term."""
        names, terms = [n for n in self.read if rest is None or n != rest.dimension], []
        query = self._query if rest is None else rest.rest_rows
        before, after = self.versions(time - 1), self.versions(time)
        for i, name in enumerate(names):
            if before[name] == after[name] or of is not None and name not in of or name in padded or any(
                    not feeds.ranges[name, column] for other, pairs in self._join_keys.get(name, {}).items()
                    if other not in padded for column, _ in pairs):
                continue
            others = dict(self._unread_rows)
            for j, other in enumerate(names):
                if j == i:
                    continue
                if other in padded:
                    others[other] = self._padded_rows[other]
                    continue
                if other in self._apart.get(name, ()):  # in no branch with it: its branches' terms only
                    others[other] = self._no_rows[other]
                    continue
                cuts = [(other_column, feeds.ranges[name, column], False)
                        for column, other_column in self._join_keys.get(name, {}).get(other, [])]
                others[other] = self._source_read(other, (after if j < i else before)[other], cuts, feeds)
            terms += [(diff, query({**others, name: rows})) for diff, rows in self._feed_rows(feeds.rows[name], time)
                      if (time, diff) in feeds.present[name]]
        return terms

    def _source_read(self, name: str, version: int, cuts: list[tuple[str, list[tuple], bool]],
                     feeds: SourceFeeds) -> DataFrame:
        """Source ``name`` at ``version`` where each ``(column, ranges, nulls)`` of ``cuts`` lies in
        its ranges (or is null, with ``nulls``): read from the files :meth:`_listed`, else through
        Delta's data skipping."""
        uris = self._listed(name, version, cuts, feeds)
        if uris is None:
            return _within(self._pinned(name, version), cuts)
        key = _listing(name, version, cuts)
        if key not in feeds.listed_rows:
            feeds.listed_rows[key] = read_files(self.session(), uris, self._pinned(name, version).schema)
        return _within(feeds.listed_rows[key], cuts)

    def _listed(self, name: str, version: int, cuts: list[tuple[str, list[tuple], bool]],
                feeds: SourceFeeds) -> list[str] | None:
        """The files of source ``name`` at ``version`` that can hold rows in ``cuts``, listed by
        :mod:`~mvsink.desired.listed_files` (with no Spark job preparing the scan); None where the
        table or its schema does not allow it or the listing does not prune every column of
        ``cuts``. One listing per step for each source, version and cuts."""
        key = _listing(name, version, cuts)
        if key not in feeds.listed:
            feeds.listed[key] = None
            schema = self._pinned(name, version).schema
            # a column the listing does not prune by (a float, a collated string): read through Delta
            listable = readable(schema) and all(prunes(schema[column].dataType) for column, _, _ in cuts)
            if listable and (name, version) not in self._add_actions:
                self._add_actions[name, version] = add_actions(self.sources[name], version)
            actions = self._add_actions[name, version] if listable else None
            if actions is not None:
                feeds.listed[key] = files_in_ranges(self.sources[name], actions, schema, cuts)
                feeds.listed_reads.append(SourceRead(spark_uri(self.sources[name]), version, len(feeds.listed[key]),
                                                     actions.num_rows))
        return feeds.listed[key]

    def _in_groups_after_and_before(self, name: str, versions: tuple[int, int],
                                    cuts: list[tuple[str, list[tuple], bool]], groups: DataFrame,
                                    feeds: SourceFeeds) -> list[DataFrame]:
        """Source ``name``'s rows in ``groups`` (of :attr:`per_group`'s columns) at each of
        ``versions``, read where ``cuts`` allow. Where both versions' files are listed, the files
        they share (all of them, for a source that did not move) are read once: their rows in the
        groups are shuffled by the group columns, one shuffle that both versions' plans hold alike,
        so Spark computes it once in the step's job and reuses it (``ReusedExchange``)."""
        columns = self.per_group.keys[name]
        listed = [self._listed(name, version, cuts, feeds) for version in versions]
        schemas = {self._pinned(name, version).schema for version in versions}
        if None in listed or len(schemas) > 1:
            return [in_groups(self._source_read(name, version, cuts, feeds), groups, columns, feeds.small)
                    for version in versions]
        (schema,), shared = schemas, set(listed[0]) & set(listed[1])

        def in_files(uris: set[str]) -> DataFrame:
            return in_groups(_within(read_files(self.session(), sorted(uris), schema), cuts), groups, columns, feeds.small)
        shared_rows = in_files(shared).repartition(*columns) if shared else None

        def read(uris: list[str]) -> DataFrame:
            apart = set(uris) - shared
            if shared_rows is None:
                return in_files(apart)
            return shared_rows.unionByName(in_files(apart)) if apart else shared_rows
        return [read(uris) for uris in listed]

    def _pinned(self, name: str, version: int) -> DataFrame:
        """Source ``name`` at ``version``: one DataFrame for all the terms and steps that read that
        version (as the version after one step's change is the version before the next's), so
        Delta loads its snapshot and the file statistics data skipping reads once, not per read
        (a version that is not the newest is not cached by Delta). Versions below the one before
        the step are dropped by :meth:`_source_feeds`."""
        if (name, version) not in self._pinned_reads:
            self._pinned_reads[name, version] = self.read_source(name, version, self.session())
        return self._pinned_reads[name, version]

    def _aggregate_changes(self, times: list[int]) -> Changes:
        """Per time, the groups' state moved by the sources' changes (the aggregate's input over
        each term of :meth:`_change_terms`, with its diff; over a per-group query, of
        :meth:`_group_terms`: its changed groups' rows after and before), and the moved groups' output rows before (-1)
        and after (+1), see :mod:`mvsink.desired.linear_aggregate`. Each time's new state and its updates
        are held by one Spark job, which also counts them (in one task where the feed and the
        groups are small); where distinct groups have distinct rows, the updates are consolidated
        as they are, and the keys whose row count may change are those of the held groups that
        say so (read by the key check, no job of their own). The next step starts from the last
        state. Where the join has a dimension whose version moves in the step (or moved in the last
        quiet steps), its changes meet the rest of the join held instead (:meth:`_dimension_changes`)."""
        aggregate, groups = self.aggregate, self._groups
        if self._state_time != times[0] - 1:  # none held for that time (after a recomputed range)
            self._hold_state(times[0] - 1)
        moving = {name for name in self.read
                  if any(self.versions(t - 1)[name] != self.versions(t)[name] for t in times)}
        rest = self._rest if self._rest is not None and self._rest.stepped(self._rest.split.dimension in moving) else None
        if rest is not None and self._arrow_dimension is not None:
            moved = self._dimension_moved_here(times)
            if moved is not None:
                return moved
        computed = self._terms_here(times) if self._in_process is not None and rest is None else None
        if computed is not None and self._arrow_groups is not None:
            moved = self._moved_here(times, *computed)
            if moved is not None:
                return moved
        in_process = self._state_rows_in_process(*computed) if computed is not None else None
        if in_process is not None:  # small: the terms computed here, their rows a local relation
            feeds = SourceFeeds({}, True, {}, {}, {}, listed_reads=in_process[1])
        else:
            # held: read once for all the times, and a query over held rows keeps its Aggregate (over
            # the log's changes, a constant diff can make the optimizer drop an empty term's plan)
            feeds = self._source_feeds(times)
        group_cuts = self._group_ranges(feeds) if self.per_group is not None else None
        if rest is not None and rest.time != times[0] - 1:
            self._hold_rest(times[0] - 1)
        parts, key_moving, size, key_moves, executed, cuts = [], [], 0, False, [], []
        for time in times:
            changed = (in_process[0].get(time) if in_process is not None
                       else self._dimension_changes(time, feeds, executed) if rest is not None
                       else self._term_changes(time, feeds, group_cuts))
            if changed is None:  # no change at this time joins anything: the groups stay
                self._state_time = time
                continue
            one_task = feeds.small and self._state_groups <= ONE_TASK_GROUPS
            combined, (moved, moves, kept, *touched) = held_observing(
                groups.next_state(self._spark_state(), changed, one_task), _MOVED, *groups.movement(feeds.small),
                executed=executed)
            size, key_moves = size + moved, key_moves or moves
            if touched:
                cuts.append(touched_ranges(*touched, self.schema[self.view.key[0]].dataType, feeds.small))
            parts.append(self._as_updates(_through(self._top, groups.updates(combined)), time))
            if self._top is None:
                key_moving.append(groups.key_moving_updates(combined))
            self._state, self._state_time, self._state_groups = groups.kept_state(combined), time, kept
            self._state_arrow = None
        updates = self._finish(reduce(DataFrame.unionByName, parts)) if parts else self._no_updates()
        reads = self._named((*(read for frame in executed for read in delta_reads(frame)), *feeds.listed_reads))
        here = "terms" if in_process is not None else ""
        if self._top is not None or not aggregate.rows_are_distinct:
            # consolidated in one task where they are few: ``size`` counts them (before a top, which drops some)
            changes = held_changes(updates, times[0], self.view.key, size <= ONE_TASK_GROUPS, few=feeds.small)
            if self._keyed_by_groups:  # a row per group at most: no key violation can start
                changes = replace(changes, key_counts_change=False)
            return replace(changes, reads=reads, in_process=here)
        if not self.view.key:
            return Changes(updates, size, times[0], reads=reads, in_process=here)
        touched = reduce(DataFrame.unionByName, key_moving).select(*self.view.key) if key_moving else None
        ranges = (None if None in cuts else
                  ([r for ranges, _ in cuts for r in ranges], any(nulls for _, nulls in cuts)))
        return Changes(updates, size, times[0], key_moves, touched, touched_ranges=ranges, reads=reads, in_process=here)

    def _terms_in_process(self, query_over_held: DataFrame, read_held: dict[str, DataFrame]) -> InProcessTerms | None:
        """How the join's change terms are computed in this process (:mod:`mvsink.desired.in_process`):
        the query (a linear aggregate's input) over the held rows, its plan translated; None where it is not."""
        rows = self.aggregate.aggregate_input(query_over_held) if self.aggregate is not None else query_over_held
        try:
            plan = ArrowPlan(rows, held_names(read_held))
        except NotTranslated as exc:
            self._in_process_refused = str(exc)
            return None
        return InProcessTerms(plan, {name: self.sources[name] for name in self.read}, self.read, self._join_keys,
                              {name: read_held[name].schema for name in self.read})

    def _dimension_in_process(self, split: DimensionSplit, groups: ArrowGroups, join_keys: dict,
                              read_held: dict[str, DataFrame]) -> ArrowDimension | str:
        """How a dimension's steps move ``groups`` in this process: the dimension's filters and
        projections, and the rest's plan, over the held rows, translated; else what they have that
        is not."""
        dimension, others = split.dimension, tuple(name for name in self.read if name != split.dimension)
        names = held_names(read_held)
        try:
            side = ArrowPlan(split.side_rows(read_held[dimension]), names)
            rest = ArrowPlan(split.rest_rows({name: read_held[name] for name in others}), names)
        except NotTranslated as exc:
            return str(exc)
        keys = {name: {other: pairs for other, pairs in join_keys.get(name, {}).items() if other in others}
                for name in others}
        return ArrowDimension(
            split, groups,
            InProcessTerms(side, {dimension: self.sources[dimension]}, (dimension,), {},
                           {dimension: read_held[dimension].schema}),
            InProcessTerms(rest, {name: self.sources[name] for name in others}, others, keys,
                           {name: read_held[name].schema for name in others}))

    def _dimension_moved_here(self, times: list[int]) -> Changes | None:
        """The groups' state moved in this process by the dimension's and the rest's changes,
        the rest held here (:mod:`mvsink.desired.arrow_dimension`), and its updates as a local
        relation; None where the step is Spark's (the reason logged), nothing moved."""
        state = self._arrow_state()
        if state is None:
            return None
        if self._rest.time != times[0] - 1:
            self._hold_rest(times[0] - 1)
        held = self._rest.arrow()
        if held is None:
            log.info("view %r: the rest of its join is moved by Spark: more than %d groups", self.view.view_id,
                     MOST_GROUPS)
            return None
        try:
            step = self._arrow_dimension.step(held, state.schema, times, self.versions)
            moved = self._arrow_groups.step_by(state, step.changes)
        except (Declined, NotEvaluated) as exc:
            log.info("view %r: the terms of times %d..%d are computed by Spark: %s",
                     self.view.view_id, times[0], times[-1], exc)
            return None
        self._rest.hold_arrow(times[-1], step.rest)
        return self._held_step(times, moved, step.reads)

    def _terms_here(self, times: list[int]) -> tuple[pa.Table, list[SourceRead]] | None:
        """The rows of the join's change terms (a linear aggregate's input rows, with their
        ``TIME`` and ``DIFF``) computed in this process, and the other sides' reads; None where
        the step is Spark's (the reason logged)."""
        try:
            return self._in_process.terms(times, self.versions)
        except Declined as exc:
            log.info("view %r: the terms of times %d..%d are computed by Spark: %s",
                     self.view.view_id, times[0], times[-1], exc)
            return None

    def _terms_by_time(self, rows: pa.Table) -> dict[tuple[int, int], DataFrame]:
        """``rows`` of :meth:`_terms_here` as one local relation, by time and diff."""
        frame = local_relation(self.session(), rows, self._in_process.schema)
        present = sorted(set(zip(rows.column(TIME).to_pylist(), rows.column(DIFF).to_pylist())))
        return {(time, diff): frame.where((F.col(TIME) == time) & (F.col(DIFF) == diff)).drop(TIME, DIFF)
                for time, diff in present}

    def _state_rows_in_process(self, rows: pa.Table, reads: list[SourceRead]
                               ) -> tuple[dict[int, DataFrame], list[SourceRead]]:
        """Per time, the aggregate's state rows (in Spark) of :meth:`_terms_here`' ``rows``."""
        changed = {}
        for (time, diff), part in self._terms_by_time(rows).items():
            part = self._groups.rows_as_state(part, diff)
            changed[time] = changed[time].unionByName(part) if time in changed else part
        return changed, reads

    def _moved_here(self, times: list[int], rows: pa.Table, reads: list[SourceRead]) -> Changes | None:
        """The groups' state moved in this process by ``rows`` of :meth:`_terms_here`
        (:mod:`mvsink.desired.arrow_groups`), and its updates as a local relation; None where it
        is Spark's (a state too large, a value Spark decides: the reason logged), the state untouched."""
        state = self._arrow_state()
        if state is None:
            return None
        try:
            step = self._arrow_groups.step(state, rows, times)
        except NotEvaluated as exc:
            log.info("view %r: the groups' state of times %d..%d is moved by Spark: %s",
                     self.view.view_id, times[0], times[-1], exc)
            return None
        return self._held_step(times, step, reads)

    def _held_step(self, times: list[int], step: Step, reads: list[SourceRead]) -> Changes:
        """The groups' state after ``step`` (moved here over ``times``) held here, and its changes."""
        self._state_arrow, self._state, self._state_groups = step.state, None, step.state.num_rows
        self._state_time = times[-1]
        return self._step_changes(times, step, reads)

    def _step_changes(self, times: list[int], step: Step, reads: list[SourceRead]) -> Changes:
        """The changes of ``step``, moved here over ``times`` (its updates a local relation)."""
        schema = T.StructType([*self.user_schema.fields, T.StructField(TIME, T.LongType()),
                               T.StructField(DIFF, T.LongType())])
        updates = self._finish(self._as_updates(local_relation(self.session(), step.updates, schema)))
        kwargs = dict(reads=self._named(tuple(reads)), in_process="terms and groups")
        if not self.view.key:
            return Changes(updates, step.updates.num_rows, times[0], **kwargs)
        touched, ranges = None, None
        if step.key_counts_change:  # the key check reads the table's files that can hold their first column
            key_schema = T.StructType([self.user_schema[k] for k in self.view.key])
            touched = local_relation(self.session(), step.touched.cast(arrow_schema(key_schema)), key_schema)
            first = step.touched.column(self.view.key[0])
            if is_ranged(key_schema[0].dataType.simpleString()):
                ranges = (ranges_of_column(first), first.null_count > 0)
        return Changes(updates, step.updates.num_rows, times[0], step.key_counts_change, touched,
                       touched_ranges=ranges, **kwargs)

    def _recompute_in_process(self, query_over_held: DataFrame, read_held: dict[str, DataFrame]) -> None:
        """How a per-group aggregate's changed groups are recomputed in this process
        (:mod:`mvsink.desired.arrow_recompute`): its shape, its input's plan translated, its terms'
        reader; else why not (in ``_recompute_refused``)."""
        shape = recomputed_shape(query_over_held, HELD_ROWS, len(self.read))
        if shape is None:
            self._recompute_refused = ("it is not one aggregate over an inner join or one source of counts, sums, "
                                       "averages, min, max and one count(DISTINCT) of exact types")
            return
        rows = shape.aggregate_input(query_over_held)
        found = arrow_recompute(shape, self.user_schema, rows.schema, self.view.key)
        if isinstance(found, str):
            self._recompute_refused = found
            return
        try:
            plan = ArrowPlan(rows, held_names(read_held))
        except NotTranslated as exc:
            self._recompute_refused = f"its plan has {exc}"
            return
        keys = join_keys(query_over_held, read_held) if len(self.read) > 1 else {}
        self._recompute, self._recompute_terms = found, InProcessTerms(
            plan, {name: self.sources[name] for name in self.read}, self.read, keys,
            {name: read_held[name].schema for name in self.read})
        split = (split_at_dimension(query_over_held, held_names(read_held), aggregate_arguments(query_over_held),
                                    [o.column if o.expression is not None else None for o in shape.outputs])
                 if len(self.read) > 1 else None)
        if split is not None:
            found = self._dimension_in_process(split, self._recompute, keys, read_held)
            self._recompute_dimension, self._recompute_dimension_refused = ((None, found) if isinstance(found, str)
                                                                            else (found, None))

    def _hold_inputs(self, time: int) -> bool:
        """Whether the aggregate's input at ``time`` is held here now (from Spark: one job over the
        sources at its versions; over a join with a dimension, the rest of the join held first
        and the input the dimension's rows joined with it, so that a first step where the
        dimension moves finds the rest held); an input of more than :data:`MOST_GROUPS` rows is
        not, and its groups are recomputed in Spark from then on (logged)."""
        self._inputs_rest = None
        inputs = self._inputs_from_rest(time) if self._recompute_dimension is not None else None
        if inputs is None:
            rows = self._recompute.spark_inputs(
                self._recompute.aggregate.aggregate_input(self._contents(self.versions(time))))
            inputs = rows.limit(MOST_GROUPS + 1).toArrow()
        if inputs.num_rows > MOST_GROUPS:
            log.info("view %r: its changed groups are recomputed by Spark: its input has more than %d rows",
                     self.view.view_id, MOST_GROUPS)
            self._recompute = self._recompute_terms = self._recompute_dimension = None
            self._inputs = self._inputs_time = None
            return False
        self._inputs, self._inputs_time = inputs, time
        return True

    def _hold_inputs_rest(self, time: int) -> bool:
        """Whether the multiset of the rest of the join without its dimension at ``time`` (the
        input's time) is held here now, by the dimension's keys (one Spark job over the other
        sources at its versions, its seconds in :attr:`_setup_seconds`); a rest of more than
        :data:`MOST_REST_ROWS` rows is not, and the dimension's changes meet the other sources from
        then on (logged)."""
        split, started = self._recompute_dimension.split, monotonic()
        versions = self.versions(time)
        rows = self._recompute.spark_inputs(
            split.rest_rows({name: self._pinned(name, versions[name]) for name in self.read if name != split.dimension}),
            keep=tuple(k for _, k in split.keys), absent=dict(split.group_types))
        rest = rows.limit(MOST_REST_ROWS + 1).toArrow()
        self._setup_seconds += monotonic() - started
        if rest.num_rows > MOST_REST_ROWS:
            log.info("view %r: %s's changes meet the other sources: the rest of its join has more than %d rows",
                     self.view.view_id, split.dimension, MOST_REST_ROWS)
            self._recompute_dimension = None
            return False
        log.info("view %r: the rest of its join held by %s's keys at time %d (%d rows, %.2f s)",
                 self.view.view_id, split.dimension, time, rest.num_rows, monotonic() - started)
        self._inputs_rest = rest
        return True

    def _inputs_from_rest(self, time: int) -> pa.Table | None:
        """The aggregate's input at ``time`` from the rest of the join held at ``time`` and the
        dimension's rows at its version, read here (``γ(D ⋈ R)`` of :mod:`mvsink.desired.dimension`);
        None where the rest is too large or the dimension's rows are Spark's (logged)."""
        if not self._hold_inputs_rest(time):
            return None
        dimension = self._recompute_dimension.split.dimension
        try:
            rows, _ = self._recompute_dimension.joined_at(self._inputs_rest, self.versions(time)[dimension])
            schema = pa.schema([self._inputs_rest.schema.field(name) for name in
                                (*self._recompute.group_names, *self._recompute.argument_names, ROWS)])
            return self._recompute.summed(rows, schema)
        except (Declined, NotEvaluated) as exc:
            log.info("view %r: its input is held from Spark: %s", self.view.view_id, exc)
            return None

    def _meets_held_rest(self, times: list[int]) -> bool:
        """Whether the step over ``times`` moves the input held by the dimension's and the rest's
        changes, the rest held (:mod:`mvsink.desired.arrow_dimension`): where the dimension's
        version moves in it, or moved in the last :data:`QUIET_STEPS` steps (then the rest is
        dropped). The input and the rest are held at the time before ``times`` where it does."""
        if self._recompute_dimension is None:
            return False
        dimension = self._recompute_dimension.split.dimension
        moves = any(self.versions(t - 1)[dimension] != self.versions(t)[dimension] for t in times)
        self._rest_quiet = 0 if moves else self._rest_quiet + 1
        if not moves and (self._inputs_rest is None or self._rest_quiet >= QUIET_STEPS):
            self._inputs_rest = None
            return False
        if self._inputs_time != times[0] - 1 and not self._hold_inputs(times[0] - 1):
            return False
        if self._inputs_rest is None and self._recompute_dimension is not None:
            self._hold_inputs_rest(times[0] - 1)
        return self._inputs_rest is not None

    def _recomputed_result(self) -> DataFrame:
        """The query's result at the time of the input held: its groups' rows, recomputed here
        (the query over the sources where Spark decides a value)."""
        try:
            rows = self._recompute.outputs(self._inputs)
        except NotEvaluated as exc:
            log.info("view %r: its result at time %d is computed by Spark: %s", self.view.view_id,
                     self._inputs_time, exc)
            return self._result_at(self._inputs_time)
        return local_relation(self.session(), rows, self.user_schema)

    def _recomputed_here(self, times: list[int]) -> Changes | None:
        """The aggregate's input held here moved by the terms of ``times`` computed here, and
        its changed groups recomputed from it (:mod:`mvsink.desired.arrow_recompute`); None where
        the step is Spark's (the reason logged; the input held is dropped). Where the join has a
        dimension that moves (:meth:`_meets_held_rest`), the dimension's change meets the rest of
        the join held instead of the other sources."""
        try:
            rest = None
            if self._meets_held_rest(times):
                moved = self._recompute_dimension.step(self._inputs_rest, self._inputs.schema, times,
                                                       self.versions)
                step = self._recompute.step_by(self._inputs, moved.changes)
                rest, reads = moved.rest, moved.reads
            elif self._recompute is None:  # its input was too large to hold
                return None
            else:
                rows, reads = self._recompute_terms.terms(times, self.versions)
                if self._inputs_time != times[0] - 1 and not self._hold_inputs(times[0] - 1):
                    return None
                step = self._recompute.step(self._inputs, rows, times)
        except (Declined, NotEvaluated) as exc:
            log.info("view %r: the groups of times %d..%d are recomputed by Spark: %s",
                     self.view.view_id, times[0], times[-1], exc)
            self._inputs = self._inputs_rest = self._inputs_time = None
            return None
        self._inputs, self._inputs_rest, self._inputs_time = step.state, rest, times[-1]
        return self._step_changes(times, step, reads)

    def _term_changes(self, time: int, feeds: SourceFeeds, group_cuts: list | None) -> DataFrame | None:
        """The aggregate's state rows of its input's change at ``time``: of the terms of
        :meth:`_change_terms` (an outer join's: the inner join's and the kept side's padded), or
        with ``group_cuts``, of :meth:`_group_terms`; through the one below's state for a rollup
        (:meth:`_moved_below`). None where no change at ``time`` joins anything."""
        terms = (self._change_terms(time, feeds) if group_cuts is None
                 else self._group_terms(time, feeds, group_cuts))
        if self.padded:  # the inner join's terms, and the kept side's padded (its own changes)
            terms = ([(diff, inner_joined(result)) for diff, result in terms]
                     + self._change_terms(time, feeds, padded=self.padded))
        if not terms:
            return None
        inputs = [(diff, self.aggregate.aggregate_input(result)) for diff, result in terms]
        if self.below is not None:
            inputs = self._moved_below(inputs, feeds.small)
        return reduce(DataFrame.unionByName, [self._groups.rows_as_state(rows, diff) for diff, rows in inputs])

    def _hold_rest(self, time: int) -> None:
        """The rest of the join without its dimension aggregated at ``time``, held
        (:mod:`mvsink.desired.dimension`): one job over the other sources at its versions. Its
        seconds are kept in :attr:`_setup_seconds`: ``auto`` weighs a step without them (the
        rest is held once while the dimension keeps changing, as a view is hydrated once)."""
        versions, split = self.versions(time), self._rest.split
        started = monotonic()
        self._rest.hold(time, split.rest_rows({name: self._pinned(name, versions[name])
                                               for name in self.read if name != split.dimension}))
        self._setup_seconds += monotonic() - started
        log.info("view %r: the rest of its join held aggregated by %s's keys at time %d (%d groups, %.2f s)",
                 self.view.view_id, split.dimension, time, self._rest.size, monotonic() - started)

    def _dimension_changes(self, time: int, feeds: SourceFeeds, executed: list[DataFrame]) -> DataFrame | None:
        """The aggregate's state rows of the join's change at ``time`` from the rest held
        (:mod:`mvsink.desired.dimension`): the dimension's change joined with the rest before, and
        the rest's change (its own terms, held) joined with the dimension after; the rest moved
        to ``time``. None where no change at ``time`` joins anything."""
        rest = self._rest
        split, parts = rest.split, []
        dimension = split.dimension
        if dimension in feeds.rows:
            changed = [(split.side_rows(rows), diff) for diff, rows in self._feed_rows(feeds.rows[dimension], time)
                       if (time, diff) in feeds.present[dimension]]
            parts += [rest.joined(rest.state, changed)] if changed else []
        terms = self._change_terms(time, feeds, rest=split)
        if terms:
            delta, (rows,) = held_observing(
                reduce(DataFrame.unionByName, [rest.as_state(rows, diff) for diff, rows in terms]),
                f"{_MOVED}_rest", F.count(F.lit(1)), executed=executed)
            after = self._pinned(dimension, self.versions(time)[dimension])
            parts.append(rest.joined(delta, [(split.side_rows(after), 1)]))
            rest.move(time, delta, rows)
        else:
            rest.time = time
        return reduce(DataFrame.unionByName, parts) if parts else None

    def _moved_below(self, inputs: list[tuple[int, DataFrame]], small: bool) -> list[tuple[int, DataFrame]]:
        """The linear aggregate below's output rows that its input's changed rows (``inputs``: its
        input rows, as the query's terms give them, with their diffs) retract (-1) and add (+1):
        its state moved by them and held (one Spark job; one task where the change is ``small``
        and its groups few), as :meth:`_aggregate_changes` moves the one above."""
        below, shape = self._below_groups, self.below
        changed = reduce(DataFrame.unionByName, [below.rows_as_state(shape.aggregate_input(rows), diff)
                                                 for diff, rows in inputs])
        one_task = small and self._below_size <= ONE_TASK_GROUPS
        combined, self._below_size = checkpointed(below.next_state(self._below_state, changed, one_task))
        self._below_state, moved = below.kept_state(combined), _through(self._below_top, below.updates(combined))
        return [(1, moved.where(F.col(DIFF) > 0)), (-1, moved.where(F.col(DIFF) < 0))]

    def _per_group_changes(self, times: list[int]) -> Changes:
        """Per time, the query over the sources at its versions (+1) and at the versions before
        (-1), each restricted to the time's changed groups (:meth:`_group_terms`), consolidated
        (see :mod:`mvsink.desired.per_group`); or, where they can be, the changed groups
        recomputed in this process (:meth:`_recomputed_here`)."""
        if self._recompute is not None:
            changes = self._recomputed_here(times)
            if changes is not None:
                return changes
        feeds = self._source_feeds(times)
        cuts = self._group_ranges(feeds)
        parts = [self._as_updates(result, time, diff)
                 for time in times for diff, result in self._group_terms(time, feeds, cuts)]
        updates = self._finish(reduce(DataFrame.unionByName, parts)) if parts else self._no_updates()
        changes = held_changes(updates, times[0], self.view.key, reads=True, few=feeds.small)
        return replace(changes, reads=self._named(changes.reads + tuple(feeds.listed_reads)))

    def _group_terms(self, time: int, feeds: SourceFeeds, cuts: list[tuple[list[tuple], bool] | None]
                     ) -> list[tuple[int, DataFrame]]:
        """The per-group query's change at ``time`` as terms ``(diff, result)``: the query over the
        sources at the time's versions (+1) and at the versions before (-1), each source restricted
        to the groups of the sources' rows changed at that time; none where no source's rows did.
        Each source that holds the groups is read where its group columns lie in ``cuts``
        (:meth:`_group_ranges`, the ranges of the step's changed values of every source, or null,
        where some is), then exactly in the time's groups; a source read whole (of an aggregate of
        a join) is read in full, its groups found by :meth:`_joined_groups`."""
        keys = self.per_group.keys
        moved = [feeds.rows[name].where(F.col(TIME) == time).select(
                     *(F.col(c).alias(f"_group_{i}") for i, c in enumerate(keys[name])))
                 for name in keys if name in feeds.rows and {(time, 1), (time, -1)} & feeds.present[name]]
        if time in feeds.joined_times:
            moved.append(feeds.joined.where(F.col(TIME) == time).drop(TIME))
        if not moved:
            return []
        groups = reduce(DataFrame.unionByName, moved).distinct()
        after, before = self.versions(time), self.versions(time - 1)
        restricted = {name: (self._pinned(name, after[name]), self._pinned(name, before[name]))
                      for name in self.per_group.whole}
        for name, columns in keys.items():
            restricted[name] = self._in_groups_after_and_before(name, (after[name], before[name]), [
                (column, *cut) for column, cut in zip(columns, cuts) if cut is not None], groups, feeds)
        return [(diff, self._query({**self._unread_rows, **{name: pair[i] for name, pair in restricted.items()}}))
                for i, diff in enumerate((1, -1))]

    def _per_group_query(self, result: DataFrame) -> DataFrame:
        """The per-group query of ``result`` (the view's query over some rows): itself, or the
        input of the linear aggregate over it."""
        return self.aggregate.aggregate_input(result) if self.aggregate is not None else result

    def _joined_groups(self, times: list[int], feeds: SourceFeeds) -> None:
        """For an aggregate of a join: the groups that the changes at ``times`` of its sources
        read whole touch, the grouping columns' distinct values over each such source's terms of
        the join's change (:meth:`_change_terms`: its change joined with the other sources, read
        where they join it) in the rows that hold a changed row
        (:func:`~mvsink.desired.per_group.holding_rows_of`), held in ``feeds`` with the times they
        have rows at and each column's ranges (one bounded job per column: a small change can
        touch many groups)."""
        parts = [self._groups_of(holding_rows_of(result, feeds.rows[name])).withColumn(TIME, F.lit(time).cast("long"))
                 for name in self.per_group.whole if name in feeds.rows
                 for time in times for _, result in self._change_terms(time, feeds, (name,))]
        if not parts:
            return
        rows = reduce(DataFrame.unionByName, parts)
        columns = [c for c in rows.columns if c != TIME]
        ranged = [c for c in columns if is_ranged(rows.schema[c].dataType.simpleString())]
        held, (present, *nulls) = held_observing(
            rows, _JOINED_GROUPS, F.to_json(F.collect_set(TIME)), *(F.max(F.col(c).isNull()) for c in ranged))
        ranges, nulls = key_ranges(held, ranged), dict(zip(ranged, nulls))
        feeds.joined, feeds.joined_times = held, set(json.loads(present))
        feeds.joined_cuts = [(ranges[c], bool(nulls[c])) if c in ranges else None for c in columns]

    def _groups_of(self, result: DataFrame) -> DataFrame:
        """The groups of the per-group query of ``result``: the values of its grouping columns
        :attr:`per_group` restricts by (``R``), named ``_group_<i>``
        (:func:`~mvsink.desired.aggregate_top.aggregate_groups`)."""
        groups = aggregate_groups(self._per_group_query(result))
        groups = groups.toDF(*(f"_grouping_{k}" for k in range(len(groups.columns))))  # names may repeat
        return groups.select(*(F.col(f"_grouping_{k}").alias(f"_group_{i}")
                               for i, k in enumerate(self.per_group.grouping)))

    def _group_ranges(self, feeds: SourceFeeds) -> list[tuple[list[tuple], bool] | None]:
        """Per group column (by its place in :attr:`per_group`'s keys): the ranges covering the
        values of it in every source's change of the step (and in the groups
        :meth:`_joined_groups` found), and whether one is null; None where a changed source's
        column is not of a type ranges prune."""
        keys = self.per_group.keys
        changed = [name for name in keys if name in feeds.rows]
        cuts = []
        for i in range(len(next(iter(keys.values())))):
            parts = [(feeds.ranges[c], feeds.nulls[c]) if c in feeds.ranges else None
                     for c in ((name, keys[name][i]) for name in changed)]
            if feeds.joined is not None:
                parts.append(feeds.joined_cuts[i])
            cuts.append(None if None in parts else
                        ([r for ranges, _ in parts for r in ranges], any(null for _, null in parts)))
        return cuts

    @staticmethod
    def _feed_rows(feed: DataFrame, time: int) -> list[tuple[int, DataFrame]]:
        """The feed's inserted (+1) and deleted (-1) rows at ``time``, in the source's columns."""
        return [(diff, feed.where((F.col(TIME) == time) & (F.col(DIFF) == diff)).drop(TIME, DIFF))
                for diff in (1, -1)]

    def _row_wise_changes(self, times: list[int]) -> Changes:
        """The query over the source's change feed (held): per time, over the inserted rows at +1
        and over the deleted rows at -1 (see :mod:`mvsink.desired.row_wise`)."""
        (name,) = self.read
        if all(self.versions(t - 1)[name] == self.versions(t)[name] for t in times):
            return Changes(self._no_updates(), 0, times[0], False if self.view.key else None)  # only unread sources moved
        feed, first, last = self._feed(times)
        small = changes_are_small(self.sources[name], first, last)
        feed, grows, shrinks = self._hold_feed(feed, small)
        parts = [self._as_updates(self._query({**self._unread_rows, name: rows}), time, diff)
                 for time in times for diff, rows in self._feed_rows(feed, time)]
        changes = held_changes(self._finish(reduce(DataFrame.unionByName, parts)), times[0], self.view.key,
                               one_task=small)
        if self._source_keys_unique(grows, shrinks, times, changes.key_counts_change):
            return replace(changes, key_counts_change=False, touched=None)
        return changes

    def _hold_feed(self, feed: DataFrame, small: bool) -> tuple[DataFrame, bool, bool]:
        """The ``feed`` held, and whether some source key's row count grows, and whether one
        shrinks, at some time in it (both True where the view's key is not the source's):
        observed by the Spark job that holds it, over per-(key, time) sums of the feed shuffled
        by the key (gathered in one task if ``small``: no shuffle)."""
        if self._source_key is None:
            return feed.localCheckpoint(eager=True), True, True
        spread = feed.coalesce(1) if small else feed.repartition(*self._source_key)
        net = spread.withColumn(NET, F.sum(DIFF).over(Window.partitionBy(*self._source_key, TIME)))
        held, (grows, shrinks) = held_observing(
            net, _SOURCE_KEYS, *[F.coalesce(F.max(moved), F.lit(False)) for moved in (F.col(NET) > 0, F.col(NET) < 0)],
            keep=feed.columns)
        return held, grows, shrinks

    def _source_keys_unique(self, grows: bool, shrinks: bool, times: list[int], wanted: bool) -> bool:
        """Whether the source's rows have unique key values (:attr:`_source_key`) at every one of
        ``times``. Then so do the view's, whose rows are at most one per source row and carry its
        key values: no key violation can start or end, and no key needs checking.

        Where no source key's row count ``grows``, unique keys at the time before stay unique at
        every one of ``times`` (rows replaced key for key, as an UPDATE does, or rows deleted);
        keys that repeated before still repeat where none ``shrinks``. Otherwise, if the answer
        is ``wanted`` (a key's count in the view changes), the source's key columns at the last
        time are read once (:func:`~mvsink.desired.key_check.unique_keys`): that answers for
        every time where no count moved, and for the next step where one shrank (a violation may
        end within these times, so they are checked). The answer is kept, step by step."""
        known = self._source_keys_known
        before = known[1] if known is not None and known[0] == times[0] - 1 else None
        if not grows and (before or (before is False and not shrinks)):
            self._source_keys_known = (times[-1], before)
            return before
        if grows or not wanted:
            self._source_keys_known = None
            return False
        (name,) = self.read
        rows = self.read_source(name, self.versions(times[-1])[name])
        key = self._source_key
        _, unique = unique_keys(rows.select(*key, F.lit(1).cast("long").alias(DIFF)), key)
        self._source_keys_known = (times[-1], unique)
        return unique and not shrinks

    def _recomputed_changes(self, times: list[int]) -> tuple[Changes, int]:
        """One evaluation per time, the difference to the last result: the new result at +1 and
        the last at -1, consolidated (each distinct row's count difference, exactly a multiset
        difference both ways; one shuffle for all the times, whose updates differ in time); and
        how many evaluations that took (one more where the result before had to be evaluated)."""
        evaluations = len(times)
        if self._previous_time is not None and self._previous_time >= times[0]:
            raise RuntimeError(f"snapshot input asked for changes from {times[0]} after evaluating "
                               f"{self._previous_time}")
        if not self._previous_is_before(times[0]):  # none kept (maintained until now)
            before = times[0] - 1  # a linear aggregate's groups held at that time are its result, else evaluated
            evaluations += not self._state_is_at(before)
            self._remember(before, self._state_result() if self._state_is_at(before) else self._result_at(before))
        parts = []
        for time in times:
            previous = self._previous
            self._remember(time, self._result_at(time))
            parts += [self._as_updates(self._previous, time, 1), self._as_updates(previous, time, -1)]
        updates = held_changes(self._finish(reduce(DataFrame.unionByName, parts)), times[0], self.view.key)
        if self._maintained and self.auto is None:  # back to the sources' changes next time
            self._previous = self._previous_time = None
        return updates, evaluations


def _through(top: RowWiseTop | None, rows: DataFrame) -> DataFrame:
    """A linear aggregate's rows (its output, or its core's under ``top``; other columns passed
    on) as its query's."""
    return rows if top is None else top.over(rows)


def _sources_of(leaves: list | None, held: dict[str, DataFrame]) -> frozenset[str] | None:
    """The sources whose ``held`` rows are ``leaves`` (an outer join's padded side over them),
    None where one is not a source's or the query has no outer join (``leaves`` None)."""
    by_rdd = held_names(held)
    names = {by_rdd.get(leaf.rdd().id()) for leaf in leaves or []}
    return frozenset(names) if leaves is not None and None not in names else None


def _listing(name: str, version: int, cuts: list[tuple[str, list[tuple], bool]]) -> tuple:
    """The key of source ``name``'s listing at ``version`` for ``cuts`` (:attr:`SourceFeeds.listed`)."""
    return name, version, tuple((column, tuple(ranges), nulls) for column, ranges, nulls in cuts)


def _within(rows: DataFrame, cuts: list[tuple[str, list[tuple], bool]]) -> DataFrame:
    """``rows`` where each ``(column, ranges, nulls)`` of ``cuts`` lies in its ranges (or is null,
    with ``nulls``)."""
    for column, ranges, nulls in cuts:
        rows = pruned(rows, column, ranges, nulls)
    return rows


def with_views(rows: dict[str, DataFrame], views: tuple[ViewQuery, ...]) -> dict[str, DataFrame]:
    """``rows`` and each of ``views`` computed in order over them and the views before it."""
    rows = dict(rows)
    for view in views:
        if view.sql is not None:
            rows[view.name] = _sql_over(rows, view.name, view.sql)
            continue
        result = view.query(**sources_named(view.query, rows))
        if not isinstance(result, DataFrame):
            raise ConfigError(f"the function of view {view.name!r} returned {type(result).__name__}, not a DataFrame")
        rows[view.name] = result
    return rows


def _sql_over(rows: dict[str, DataFrame], name: str, sql: str) -> DataFrame:
    """``sql`` over ``rows`` by their names, in their session. Each is registered under a name
    of its own for this one query (PySpark's DataFrame arguments of ``sql``: no other thread's
    query sees it, none of them is left behind) and read through a CTE of its own name."""
    frames = list(rows.values())
    ctes = ",\n".join(f"`{n}` AS (SELECT * FROM {{t{i}}})" for i, n in enumerate(rows))
    text = sql.replace("{", "{{").replace("}", "}}")
    return frames[0].sparkSession.sql(f"WITH {ctes}\nSELECT * FROM (\n{text}\n) AS `{name}`",
                                      **{f"t{i}": frame for i, frame in enumerate(frames)})


def _read_whole_at_every_read(reads: Reads, whole: tuple[str, ...]) -> str | None:
    """Why an aggregate of a join whose sources ``whole`` are read whole is not recomputed per group,
    in words: a source read several times (:mod:`~mvsink.desired.occurrences`), each read whole
    (TPC-H Q21's lineitem). A step would join each read's change with the other sources and read
    each read whole before and after: more than evaluating the query, which reads each once
    (measured on Q21 at scale 0.1: 9.4 s against 2.0 s). None where there is none."""
    return next((f"{source} read {len(read)} times, the groups in none of its reads: a per-group recompute "
                 f"would read it whole {2 * len(read)} times a step" for source, read in reads.by_source().items()
                 if set(read) <= set(whole)), None)


#: Optimizer rules the session of a SQL view with a scalar subquery runs without
#: (:meth:`SnapshotDesired.session`).
_UNION_PUSHDOWN_RULES = tuple(f"org.apache.spark.sql.catalyst.optimizer.{rule}"
                              for rule in ("PushProjectionThroughUnion", "CombineUnions"))


def _exclude_rules(session: SparkSession, rules: tuple[str, ...]) -> None:
    """``rules`` added to the ones ``session`` already excludes (a user's, from its Spark conf)."""
    key = "spark.sql.optimizer.excludedRules"
    excluded = [r for r in (session.conf.get(key, None) or "").split(",") if r.strip()]
    session.conf.set(key, ",".join(excluded + [r for r in rules if r not in excluded]))


def _has_scalar_subquery(frame: DataFrame) -> bool:
    """Whether ``frame``'s analyzed plan has a scalar subquery (in any expression of any node)."""
    patterns = frame.sparkSession._jvm.org.apache.spark.sql.catalyst.trees.TreePattern
    return frame._jdf.queryExecution().analyzed().containsPattern(patterns.SCALAR_SUBQUERY())


def _delta_tables(frame: DataFrame, analyzed: bool = False) -> set[str]:
    """The Delta tables the scans of ``frame``'s plan read (outside subqueries, which no strategy
    maintains), as the plan names them (``analyzed``: its analyzed plan, see
    :func:`~mvsink.desired.changes.delta_file_indexes`)."""
    return {index.path().toString() for index in delta_file_indexes(frame, analyzed)}


def _table_path(uri: str) -> str:
    """A table's URI as a plan names it: no ``file:`` scheme, no trailing slash."""
    return uri.rstrip("/").removeprefix("file:")


def _cancelled(exc: Exception) -> bool:
    """Whether ``exc`` is a Spark job cancelled (a stop cancels a running step's jobs)."""
    text = str(exc).lower()
    return "cancelled" in text or "canceled" in text


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
