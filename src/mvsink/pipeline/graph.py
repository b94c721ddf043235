"""The views' dependencies, read by Spark's own parser, and each view's query over the sources.

A SQL view's *references* are the tables its query reads: the unresolved relations of the plan
Spark's SQL parser makes of it (in subqueries too), less the names of its own CTEs; a Python
view's are its function's parameters, each the exact name of a source or view (it is given them by
name). Each must be a source or another view of the pipeline; anything else (an unknown name,
``delta.`/path```, a catalog table) is refused, since only sources are pinned by the timeline.

Views over views, consistent at every time: every view is run as one query over the sources alone.
A SQL view reading only SQL views is its own query with the views it reads (and, in order, those
they read) put before it as CTEs named after them (:meth:`ViewGraph.query_over_sources`); a view
that is Python or reads a Python view, at any depth, is its own SQL or function given the views it
reads computed first, in dependency order, from the same sources' rows
(:func:`mvsink.desired.snapshot.with_views`). Either way, at time ``t`` every replica evaluates
it over the sources at ``t``'s versions: the downstream view at ``t`` is by construction computed
from the very rows the upstream view has at ``t``, whatever either view's progress, and reading
any two views at ``t`` agrees with the sources at ``t``'s versions; so every combination of SQL
and Python views is consistent, and none is refused for it. The price is that a downstream view
computes its upstream views again (no reuse of the upstream's table); the gain is that no view
waits for another, and a change to an upstream's SQL or function changes the downstream's
definition id, so a cutover of the pipeline fences every view the change reaches
(:mod:`mvsink.definition`).

Invariants: the dependency graph has no cycle (a cycle is refused naming its views and their
files); :attr:`ViewGraph.order` lists every view after all views it reads.
"""

from __future__ import annotations

import re

from pyspark.errors import ParseException
from pyspark.sql import SparkSession

from mvsink.pipeline.config import PipelineConfig
from mvsink.pipeline.decorator import PythonView
from mvsink.pipeline.parse import PipelineError, ViewStatement


def error_line(statement: ViewStatement, exc: Exception) -> str:
    """``file:line`` of a Spark error about ``statement``'s located query (its own line if Spark
    gives none)."""
    found = re.search(r"line (\d+)", str(exc))
    return f"{statement.file}:{found.group(1) if found else statement.line}"


def first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0]


def _seq(seq) -> list:
    return [seq.apply(i) for i in range(seq.size())]


def references(spark: SparkSession, statement: ViewStatement) -> set[str]:
    """The tables ``statement``'s query reads (dotted for multi-part names), less its own CTEs."""
    try:
        plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(statement.located_query())
    except ParseException as exc:
        raise PipelineError(f"{error_line(statement, exc)}: view {statement.name}: its query does not parse: "
                            f"{first_line(exc)}") from None
    relations: set[str] = set()
    ctes: set[str] = set()
    pending = [plan]
    while pending:
        node = pending.pop()
        kind = node.nodeName()
        if kind == "UnresolvedRelation":
            relations.add(".".join(_seq(node.multipartIdentifier())))
        elif kind == "UnresolvedWith":
            ctes.update(pair._1().lower() for pair in _seq(node.cteRelations()))
        pending += _seq(node.children()) + _seq(node.innerChildren()) + _seq(node.subqueries())
    return {name for name in relations if name.lower() not in ctes}


class ViewGraph:
    """Which view reads which views and sources, in dependency order."""

    def __init__(self, spark: SparkSession, config: PipelineConfig):
        self.config = config
        known = {name.lower(): name for name in [*config.sources, *config.views]}
        #: view -> the sources and views it reads, by their pipeline names.
        self.reads: dict[str, list[str]] = {}
        for name, view in config.views.items():
            if isinstance(view, PythonView):
                self.reads[name] = self._parameters(view)
                continue
            names = []
            for table in sorted(references(spark, view)):
                if table.lower() not in known:
                    raise PipelineError(
                        f"{view.where}: view {name} reads {table}, which is neither a source "
                        f"({', '.join(sorted(config.sources))}) nor a view of the pipeline "
                        f"({', '.join(sorted(config.views))})")
                names.append(known[table.lower()])
            self.reads[name] = names
        self.order = self._order()

    def _parameters(self, view: PythonView) -> list[str]:
        """A Python view's reads: its parameters, each a source's or view's exact name (the
        function is given them by name)."""
        for parameter in view.parameters:
            if parameter not in self.config.sources and parameter not in self.config.views:
                raise PipelineError(
                    f"{view.where}: view {view.name} takes parameter {parameter}, which is neither a source "
                    f"({', '.join(sorted(self.config.sources))}) nor a view of the pipeline "
                    f"({', '.join(sorted(self.config.views))})")
        return list(view.parameters)

    def views_read(self, name: str) -> list[str]:
        return [n for n in self.reads[name] if n in self.config.views]

    def _order(self) -> list[str]:
        order: list[str] = []
        state: dict[str, str] = {}

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == "done":
                return
            if state.get(name) == "visiting":
                cycle = path[path.index(name):] + [name]
                raise PipelineError("dependency cycle: " + " -> ".join(
                    f"{v} ({self.config.views[v].where})" for v in cycle))
            state[name] = "visiting"
            for upstream in self.views_read(name):
                visit(upstream, path + [name])
            state[name] = "done"
            order.append(name)

        for name in self.config.views:
            visit(name, [])
        return order

    def upstream(self, name: str) -> list[str]:
        """Every view ``name`` reads, directly or not, in dependency order."""
        wanted: set[str] = set()
        pending = self.views_read(name)
        while pending:
            view = pending.pop()
            if view not in wanted:
                wanted.add(view)
                pending += self.views_read(view)
        return [v for v in self.order if v in wanted]

    def level(self, name: str) -> int:
        """0 for a view over sources only; else one more than the highest view it reads."""
        return max((self.level(v) + 1 for v in self.views_read(name)), default=0)

    def query_over_sources(self, name: str) -> str:
        """SQL view ``name``'s query as one query over the sources: the (SQL) views it reads as CTEs first."""
        query = self.config.views[name].query
        upstream = self.upstream(name)
        if not upstream:
            return query
        ctes = ",\n".join(f"`{v}` AS (\n{self.config.views[v].query}\n)" for v in upstream)
        return f"WITH {ctes}\nSELECT * FROM (\n{query}\n) AS `{name}`"

    def mermaid(self) -> str:
        """The pipeline as a Mermaid flowchart: sources as cylinders, views as boxes."""
        lines = ["flowchart LR"]
        lines += [f"  source_{s}[({s})]" for s in self.config.sources]
        lines += [f"  view_{v}[{v}]" for v in self.order]
        for view in self.order:
            for read in self.reads[view]:
                kind = "view" if read in self.config.views else "source"
                lines.append(f"  {kind}_{read} --> view_{view}")
        return "\n".join(lines)
