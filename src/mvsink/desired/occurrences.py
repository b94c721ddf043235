"""A source read more than once, as one source per read: a self-join maintained as a join.

A query that reads a source at several places of its text (TPC-H Q7's ``nation n1`` and
``nation n2``, a self-join ``orders a JOIN orders b``) is quadratic in that source, so no
strategy's delta rule applies to the source as one input. Read as two inputs that happen to hold
the same rows, it is linear in each again: with ``N`` read twice and its change ``D``,

    ``Q(N + D, N + D) - Q(N, N) = Q(D, N) + Q(N + D, D)``

which is the delta rule of two sources whose versions always move together. So each read after
the first of a source gets a name of its own (:func:`split_reads`), ``nation__2``, bound to the
same table: the strategies see one more source, read once, whose versions are the source's at
every time (:meth:`Reads.versions`), and they maintain the query as they would any other.

The reads are found by Spark's own parser: each ``UnresolvedRelation`` of a source's name, with
where its text starts and stops, in the query and in its subqueries. A read with an alias
(``nation n2``) is renamed in place; one without keeps its name as its alias (``nation__2 AS
nation``), so the query's qualified columns still resolve. Nothing is renamed where the query has
a common table expression named like a source (its scope is the parser's to know), where a name
has several parts, or where the renamed text does not parse: the query is then read as written.
A CTE read twice stays one read in the text and two in the plan: such a query keeps its
strategy's verdict (evaluated in full), as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from mvsink.desired.row_wise import scala_items

#: The parser's expressions that hold a subquery's plan (``IN (SELECT ...)``: an ``InSubquery`` over a ``ListQuery``).
_SUBQUERIES = frozenset({"Exists", "ScalarSubquery", "ListQuery", "LateralSubquery"})


@dataclass(frozen=True)
class Reads:
    """A query's text with a name of its own for each read of a source after its first."""

    sql: str
    #: Each added name and the declared source it reads (empty: every source is read once at most).
    extra: dict[str, str] = field(default_factory=dict)

    def versions(self, versions: dict[str, int]) -> dict[str, int]:
        """``versions`` of the declared sources, with each added name at its source's version."""
        return {**versions, **{name: versions[source] for name, source in self.extra.items()}}

    def paths(self, sources: dict[str, str]) -> dict[str, str]:
        """``sources`` (name -> path), with each added name at its source's path."""
        return {**sources, **{name: sources[source] for name, source in self.extra.items()}}

    def by_source(self) -> dict[str, list[str]]:
        """Each source read more than once, with the names of its reads (its own first)."""
        names: dict[str, list[str]] = {}
        for name, source in self.extra.items():
            names.setdefault(source, [source]).append(name)
        return names

    def words(self) -> str:
        """Which sources are read more than once and under which names (empty: none), in words."""
        return "".join(f"; {source} is read {len(read)} times, as the sources {', '.join(read)}"
                       for source, read in self.by_source().items())

    def declared(self, names) -> list[str]:
        """``names`` as the declared sources they read, each once, in their order."""
        return list(dict.fromkeys(self.extra.get(name, name) for name in names))


def split_reads(spark: SparkSession, sql: str, sources: dict[str, str]) -> Reads:
    """``sql`` with each read of a source after its first renamed (see the module doc)."""
    parser = spark._jsparkSession.sessionState().sqlParser()
    try:
        plan = parser.parsePlan(sql)
    except Exception:  # the query's own error is reported where it is run
        return Reads(sql)
    by_lower = {name.lower(): name for name in sources}
    relations: list[tuple[str, int, int, bool]] = []  # (source, start, stop, aliased)
    shadowed = False

    def visit(node, aliased: bool = False) -> None:
        nonlocal shadowed
        kind = node.nodeName()
        if kind == "UnresolvedWith":
            shadowed |= any(cte._1().lower() in by_lower for cte in scala_items(node.cteRelations()))
        if kind == "UnresolvedRelation":
            parts = node.multipartIdentifier()
            origin = node.origin()
            if (parts.size() == 1 and parts.apply(0).lower() in by_lower
                    and origin.startIndex().isDefined() and origin.stopIndex().isDefined()):
                relations.append((by_lower[parts.apply(0).lower()], origin.startIndex().get(),
                                  origin.stopIndex().get(), aliased))
        for expression in scala_items(node.expressions()):
            _visit_subqueries(expression, visit)
        for child in scala_items(node.children()):
            visit(child, kind == "SubqueryAlias")

    visit(plan)
    if shadowed:
        return Reads(sql)
    taken = {name.lower() for name in sources}
    seen: dict[str, int] = {}
    edits: list[tuple[int, int, str]] = []
    extra: dict[str, str] = {}
    for source, start, stop, aliased in sorted(relations, key=lambda r: r[1]):
        seen[source] = seen.get(source, 0) + 1
        if seen[source] == 1:
            continue
        name, k = f"{source}__{seen[source]}", seen[source]
        while name.lower() in taken:
            k += 1
            name = f"{source}__{k}"
        taken.add(name.lower())
        extra[name] = source
        edits.append((start, stop, f"`{name}`" if aliased else f"`{name}` AS `{source}`"))
    if not extra:
        return Reads(sql)
    text = sql
    for start, stop, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[stop + 1:]
    try:
        parser.parsePlan(text)
    except Exception:
        return Reads(sql)
    return Reads(text, extra)


def _visit_subqueries(expression, visit) -> None:
    """``visit`` the plan of each subquery in ``expression``."""
    if expression.getClass().getSimpleName() in _SUBQUERIES:
        visit(expression.plan())
    for child in scala_items(expression.children()):
        _visit_subqueries(child, visit)
