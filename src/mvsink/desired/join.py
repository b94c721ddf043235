"""Whether a snapshot view's query is an *inner join* or *union all* of its sources, maintained from their changes.

A query is an inner join here when its optimized logical plan is projections, filters, inner
joins and unions (``Project``, ``Filter``, ``Join`` of type inner or cross: an equi-join with any
extra condition; ``Union``: ``UNION ALL``, nested or not, each branch any of these) over one scan
per source, every source read exactly once, every expression deterministic, and no subquery. Such a
query ``Q`` is linear in each source: over multisets of rows with diffs,
``Q(.., A + D, ..) = Q(.., A, ..) + Q(.., D, ..)``. So between two times, with the
sources ``A1..An`` at their versions before and ``A1'..An'`` after, and ``Di = Ai' - Ai`` source
``i``'s change,

    ``Q(A1', .., An') - Q(A1, .., An) = sum over i of Q(A1', .., A(i-1)', Di, A(i+1), .., An)``

(the delta rule ``D(A join B) = DA join B + A' join DB``): each term is the query over source
``i``'s change (its inserted rows at +1, its deleted rows at -1, as for a row-wise query) and the
other sources, those before ``i`` at the time's versions and those after it at the versions before.
A source whose version did not move has no term. The work is each change joined with the other sides
(Spark broadcasts a small change); no earlier result is kept.

With unions, ``Q`` is a sum of *branches* (the joins a choice of one child at each ``Union`` makes),
each joining some of the sources, and linear in each; a branch without source ``i`` does not move
with it, so it must not be in ``i``'s term. Two sources are *apart* (:func:`apart_sources`) when the
lowest node over both is a ``Union``: no branch joins them. Source ``i``'s term reads every source
apart from it as no rows: each branch without ``i`` has a source apart from ``i`` (at the first
``Union`` where it leaves ``i``'s path), so it is empty, and each branch with ``i`` has none, so it is
``i``'s term of that branch, as above (a branch that is one source, row-wise, is the query over its
change alone). ``UNION`` (distinct) is an ``Aggregate`` over a ``Union``: not this shape, but a
linear aggregate over one (:mod:`mvsink.desired.linear_aggregate`: a row is there while its count is
not 0).

The other sides are read only where they can join the change (:func:`join_keys`,
:func:`key_ranges`, :func:`pruned`): for each equality ``a = b`` of the query between a column ``a``
of the changed source and a column ``b`` of another (both plain columns of one type, as an
equi-join's keys are), that source is read where ``b`` lies in a few ranges covering every non-null
``a`` of the change, so Delta skips the files (and Parquet the row groups) whose min/max statistics
or partition values lie outside. This is exact: every row of a term satisfies every equality, so
its row of the other side has ``b`` equal to some ``a`` of the change, never null (a null never
equals). Delta's data skipping of ``b IN (...)`` uses only the list's least and greatest value, so
ranges, cut at the widest gaps between the change's keys (between strings: the fewest characters
shared before they differ), are what prune: keys clustered in a few places (new orders at the
top, old ones deleted at the bottom) read a few files, keys spread everywhere read every file, as
the whole scan would. A linear aggregate over such a join
(:mod:`mvsink.desired.linear_aggregate`) moves its groups by the same terms. A source read at two
places of the query's text is two sources here (:mod:`mvsink.desired.occurrences`); one read twice
by the plan alone (a CTE read twice) makes the query quadratic in it, an outer join is not linear:
such queries, and any other shape, are evaluated in full.

The pruning stays exact with unions: a ``Union``'s output columns are its first child's, so an
equality over them names that child's sources; in a term of source ``i`` (read once) every branch
with ``i`` that reaches the equality takes ``i``'s values where it names ``i``, and the other side's
where it names the other side and the branch has it (a branch without it is not pruned by it).
"""

from __future__ import annotations

import datetime
import json
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mvsink.desired.row_wise import HELD_ROWS, plan_reads_subqueries, scala_items

#: Plan nodes over which a query stays linear in each source: row-wise nodes, inner joins and unions.
_LINEAR_NODES = frozenset({"Project", "Filter", "Join", "Union"})
INNER_JOINS = frozenset({"Inner", "Cross"})
#: Join types :func:`join_keys` reads through (an aggregate of a join's, :mod:`mvsink.desired.per_group`).
_KEYED_JOINS = INNER_JOINS | {"LeftOuter", "RightOuter", "LeftSemi", "LeftAnti"}
#: Types of join key columns the other sides are pruned by: ordered exactly alike in Python and
#: Spark (no floats: -0.0, NaN; no timestamps: time zones; strings only under the default collation).
_RANGED_TYPES = frozenset({"tinyint", "smallint", "int", "bigint", "date", "string"})
#: The most distinct keys of a change collected to cut ranges; more are pruned by their least and
#: greatest value alone (one range).
MOST_KEYS = 100_000
#: The most ranges the other side is read in.
MOST_RANGES = 16


def is_inner_join(result: DataFrame, scan: str, sources: int) -> bool:
    """Whether ``result`` is an inner join (see the module doc, unions included) of ``sources``
    leaves, each a ``scan`` node (:data:`~mvsink.desired.row_wise.TABLE_SCAN` or
    :data:`~mvsink.desired.row_wise.HELD_ROWS`), at least one join or union among them."""
    plan = result._jdf.queryExecution().optimizedPlan()
    return plan.deterministic() and not plan_reads_subqueries(result, plan) and plan_is_inner_join(plan, scan, sources)


def plan_is_inner_join(plan, scan: str, sources: int) -> bool:
    """Whether the logical ``plan`` is linear nodes, at least one join or union, over ``sources``
    ``scan`` leaves (determinism, subqueries and which leaf is which aside)."""
    leaves, joins = linear_leaves(plan)
    return (leaves is not None and joins > 0 and len(leaves) == sources
            and all(leaf.nodeName() == scan and leaf.children().isEmpty() for leaf in leaves))


def apart_sources(result: DataFrame, held: dict[str, DataFrame]) -> dict[str, set[str]]:
    """For each source of ``result`` (an inner join, unions included, or a linear aggregate over
    one, over the rows ``held``, each read once), the sources apart from it: those the lowest
    ``Union`` over both separates, which no branch of the query joins with it (none: no union)."""
    plan = result._jdf.queryExecution().optimizedPlan()
    plan = plan.child() if plan.nodeName() == "Aggregate" else plan
    by_rdd = held_names(held)
    apart: dict[str, set[str]] = {name: set() for name in held}

    def sources_under(node) -> list[str]:
        if node.nodeName() not in _LINEAR_NODES:
            return [by_rdd[node.rdd().id()]]
        below = [sources_under(child) for child in scala_items(node.children())]
        if node.nodeName() == "Union":
            for k, one in enumerate(below):
                for other in below[k + 1:]:
                    for a in one:
                        apart[a].update(other)
                    for b in other:
                        apart[b].update(one)
        return [name for names in below for name in names]

    sources_under(plan)
    return apart


def held_names(held: dict[str, DataFrame]) -> dict[int, str]:
    """Each source's name by the id of its ``held`` rows' RDD: a plan's leaf over them is named
    by its ``rdd().id()``."""
    return {rows._jdf.queryExecution().optimizedPlan().rdd().id(): name for name, rows in held.items()}


def reads_each_once(result: DataFrame, held: list[DataFrame]) -> bool:
    """Whether the leaves of ``result``'s plan (an inner join, or a linear aggregate over one)
    are the rows ``held`` (each a local checkpoint), each exactly once: the query reads what it
    is given, nothing twice."""
    plan = result._jdf.queryExecution().optimizedPlan()
    leaves, _ = linear_leaves(plan.child() if plan.nodeName() == "Aggregate" else plan)
    ids = sorted(leaf.rdd().id() for leaf in leaves or [])
    return ids == sorted(rows._jdf.queryExecution().optimizedPlan().rdd().id() for rows in held)


def linear_leaves(plan, join_types: frozenset[str] = INNER_JOINS) -> tuple[list | None, int]:
    """The leaves under the linear nodes of ``plan`` (its joins of ``join_types``) and how many
    joins and unions there are; None for the leaves if some other node or join type is among them."""
    leaves, joins, pending = [], 0, [plan]
    while pending:
        node = pending.pop()
        name = node.nodeName()
        if name == "Join":
            if node.joinType().toString() not in join_types:
                return None, joins
            joins += 1
        elif name == "Union":
            joins += 1
        elif name not in _LINEAR_NODES:
            leaves.append(node)
            continue
        children = node.children()
        pending += [children.apply(i) for i in range(children.size())]
    return leaves, joins


def join_keys(result: DataFrame, held: dict[str, DataFrame]) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """The equalities of ``result`` (an inner join, unions included, or a linear aggregate over
    one, over the rows ``held``, each read once; or an aggregate's groups over a join with outer,
    semi and anti joins among the inner ones) between plain columns of two sources: for each
    source, each other source it equals columns with and the pairs ``(its column, the other's
    column)``. Only conjuncts of inner join and filter conditions count (each holds for every row
    of the result), and only columns of the types in :data:`_RANGED_TYPES`, the same on both sides."""
    plan = result._jdf.queryExecution().optimizedPlan()
    plan = plan.child() if plan.nodeName() == "Aggregate" else plan
    leaves, _ = linear_leaves(plan, _KEYED_JOINS)
    by_rdd = held_names(held)
    columns = {}  # an output attribute's id -> (source, column, type)
    for leaf in leaves or []:  # a leaf may be an aggregate of a source (a grouped subquery): no source's columns
        name = by_rdd.get(leaf.rdd().id()) if leaf.nodeName() == HELD_ROWS else None
        for attribute in scala_items(leaf.output()):
            columns[attribute.exprId().id()] = (name, attribute.name(), attribute.dataType().simpleString())
    keys: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for left, right in _equalities(plan):
        a, b = columns.get(left), columns.get(right)
        if (a is None or b is None or a[0] is None or b[0] is None or a[0] == b[0] or a[2] != b[2]
                or not is_ranged(a[2])):
            continue
        for (one, column), (other, other_column) in (((a[0], a[1]), (b[0], b[1])), ((b[0], b[1]), (a[0], a[1]))):
            pairs = keys.setdefault(one, {}).setdefault(other, [])
            if (column, other_column) not in pairs:
                pairs.append((column, other_column))
    return keys


def _equalities(plan) -> list[tuple[int, int]]:
    """The ids of the attributes each ``EqualTo`` conjunct of an inner join or filter condition
    in ``plan`` (linear nodes, through unions and joins of any type) compares, where both sides
    are attributes."""
    found, pending = [], [plan]
    while pending:
        node = pending.pop()
        name = node.nodeName()
        if name == "Filter" or name == "Join" and node.joinType().toString() in INNER_JOINS:
            condition = node.condition()
            conjuncts = [condition] if name == "Filter" else ([condition.get()] if condition.isDefined() else [])
            while conjuncts:
                expression = conjuncts.pop()
                kind = expression.nodeName()
                if kind == "And":
                    conjuncts += [expression.left(), expression.right()]
                elif (kind == "EqualTo" and expression.left().nodeName() == "AttributeReference"
                      and expression.right().nodeName() == "AttributeReference"):
                    found.append((expression.left().exprId().id(), expression.right().exprId().id()))
        if name in _LINEAR_NODES:
            children = node.children()
            pending += [children.apply(i) for i in range(children.size())]
    return found


def is_ranged(type_name: str) -> bool:
    """Whether a column of the type ``type_name`` (its simple string) can be pruned by ranges:
    one of :data:`_RANGED_TYPES` or a decimal."""
    return type_name in _RANGED_TYPES or type_name.startswith("decimal(")


def key_sets(columns: list[str]) -> list:
    """Aggregates of each of ``columns``' distinct values, sorted, as JSON text: what
    :func:`key_ranges` cuts a small change's ranges from (observed by the Spark job that holds
    the change, whose metrics reach Python as text, not as typed values)."""
    return [F.to_json(F.sort_array(F.collect_set(c))) for c in columns]


def key_ranges(change: DataFrame, columns: list[str], sets: list | None = None) -> dict[str, list[tuple]]:
    """For each of ``columns``: closed ranges ``(least, greatest)`` covering every non-null value
    of it in ``change`` (at most :data:`MOST_RANGES`, cut at the widest gaps between its distinct
    values (strings': :func:`_string_gap`); one range where they are more than :data:`MOST_KEYS`;
    none where there is none). Cut from ``sets`` (of :func:`key_sets`, a small change's distinct
    values observed by the job that holds it) where given; otherwise collected by one bounded job per
    column (and one more for a column with more values)."""
    if sets is not None:
        return {column: ranges_of(text, change.schema[column].dataType) for column, text in zip(columns, sets)}
    ranges = {}
    for column in columns:
        keys = change.select(column).where(F.col(column).isNotNull()).distinct().limit(MOST_KEYS + 1)
        (values,) = keys.agg(F.sort_array(F.collect_list(column))).first()
        ranges[column] = (_cut(values) if len(values) <= MOST_KEYS
                          else [tuple(change.agg(F.min(column), F.max(column)).first())])
    return ranges


def ranges_of(text: str, data_type: T.DataType, cut: bool = True) -> list[tuple]:
    """Ranges covering the values of a column of ``data_type`` in ``text`` (a JSON array of them,
    sorted and distinct, as :func:`key_sets` observes them), as :func:`key_ranges` cuts them; one
    range from the first to the last unless ``cut``."""
    return ranges_of_values(_values(text, data_type), cut)


def ranges_of_values(values: list, cut: bool = True) -> list[tuple]:
    """Ranges covering ``values`` (sorted, distinct, not null, in Python's types) as
    :func:`key_ranges` cuts them; one range from the first to the last unless ``cut``."""
    if not values:
        return []
    return _cut(values) if cut and len(values) <= MOST_KEYS else [(values[0], values[-1])]


def ranges_of_column(column: pa.ChunkedArray | pa.Array) -> list[tuple]:
    """Ranges covering the non-null values of an Arrow ``column``, as :func:`ranges_of_values`."""
    return ranges_of_values(sorted(pc.unique(column.drop_null()).to_pylist()))


def _values(text: str, data_type: T.DataType) -> list:
    """The values of :func:`key_sets`' JSON ``text`` of a column of ``data_type``, in Python's types."""
    values = json.loads(text, parse_float=Decimal)
    if isinstance(data_type, T.DateType):
        return [datetime.date.fromisoformat(v) for v in values]
    if isinstance(data_type, T.DecimalType):
        return [Decimal(v) for v in values]
    return values


def _cut(values: list) -> list[tuple]:
    """Ranges covering the sorted distinct ``values``, cut at the widest gaps (see :func:`key_ranges`)."""
    if not values:
        return []
    if isinstance(values[0], str):
        gaps = sorted(range(1, len(values)), key=lambda i: _string_gap(values[i - 1], values[i]), reverse=True)
        cuts = sorted(gaps[:MOST_RANGES - 1])
    elif isinstance(values[0], (int, Decimal, datetime.date)):
        number = (lambda v: v.toordinal()) if isinstance(values[0], datetime.date) else (lambda v: v)
        gaps = sorted(range(1, len(values)), key=lambda i: number(values[i]) - number(values[i - 1]), reverse=True)
        cuts = sorted(i for i in gaps[:MOST_RANGES - 1] if number(values[i]) - number(values[i - 1]) > 1)
    else:
        return [(values[0], values[-1])]
    starts = [0, *cuts]
    return [(values[start], values[end - 1]) for start, end in zip(starts, [*cuts, len(values)])]


def _string_gap(low: str, high: str) -> tuple[int, int]:
    """How wide the gap from ``low`` to the next string ``high`` is, as far as their characters
    tell: the fewer characters they share before they differ, the wider; then the further apart
    the first characters that differ (none where ``low`` is a prefix of ``high``)."""
    common = next((k for k, (a, b) in enumerate(zip(low, high)) if a != b), min(len(low), len(high)))
    return -common, ord(high[common]) - ord(low[common]) if common < min(len(low), len(high)) else 0


def pruned(rows: DataFrame, column: str, ranges: list[tuple], nulls: bool = False) -> DataFrame:
    """``rows`` where ``column`` lies in one of ``ranges`` (none: no row), or with ``nulls`` is
    null, as a filter Delta's data skipping and Parquet's row group filters read (literals of the
    column's type; a null by the files' null counts). Built as one SQL expression: a Column per
    bound would cost a round trip to the JVM each."""
    name = "`" + column.replace("`", "``") + "`"
    if not ranges:
        return rows.where(F.expr(f"{name} IS NULL") if nulls else F.lit(False))
    data_type = rows.schema[column].dataType

    def within(least, greatest) -> str:
        if least == greatest:
            return f"{name} = {_literal(least, data_type)}"
        return f"({name} >= {_literal(least, data_type)} AND {name} <= {_literal(greatest, data_type)})"

    conditions = [within(*r) for r in ranges] + ([f"{name} IS NULL"] if nulls else [])
    return rows.where(F.expr(" OR ".join(conditions)))


def _literal(value, data_type: T.DataType) -> str:
    """``value`` (of a :data:`_RANGED_TYPES` or decimal column) as a SQL literal of ``data_type``."""
    if isinstance(value, str):
        text = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    elif isinstance(value, datetime.date):
        text = f"DATE'{value.isoformat()}'"
    elif isinstance(value, Decimal):  # exact in its text
        text = f"'{value}'"
    else:
        text = str(int(value))
    return f"CAST({text} AS {data_type.simpleString()})"
