"""A pipeline: many views in SQL and Python files, over named sources, on one timeline, run by one job.

A folder holds ``pipeline.yaml`` (sources, target root, timeline, defaults:
:mod:`mvsink.pipeline.config`), ``*.sql`` files of ``CREATE MATERIALIZED VIEW name [KEY
(col, ...)] AS SELECT ...`` statements (:mod:`mvsink.pipeline.parse`) and ``*.py`` files of
functions decorated with :func:`materialized_view` (:mod:`mvsink.pipeline.decorator`). A view
reads sources and other views by name (a Python view by its parameters' names);
:mod:`mvsink.pipeline.graph` orders them and makes each one query over the sources, so the
pipeline is consistent at every time; :mod:`mvsink.pipeline.explain` shows it (``mvsink
explain``) and reads its views' state (``mvsink status --pipeline``).

:func:`load_pipeline` checks everything before anything runs, each failure a
:class:`PipelineError` naming the file and line: a statement that is not a view's, a query that
does not parse or analyze (over the sources' current schemas), a Python file that does not import,
a function that fails or returns no DataFrame over them, an unknown source or view, a cycle, a view
defined twice (in SQL or Python), two views with one target, a key column the view does not
produce.
:meth:`Pipeline.view_specs` are then plain view specifications (:func:`mvsink.view.view_from_spec`),
one per view, each a snapshot view over all the pipeline's sources on its timeline (as the
timeline requires; so today each is evaluated in full at each time: the row-wise and
linear-aggregate strategies need a view of one source): its SQL with the SQL views it reads as
CTEs, or, where it or a view it reads is Python, its SQL or function with the views it reads
computed first (``input.views``, :func:`mvsink.desired.snapshot.with_views`). They come in
dependency order: the job creates
them as ``CreateDataflow`` commands, so a pipeline runs as a replica like a single view (several
replicas, read-only, cutover, fencing per view).
"""

from __future__ import annotations

import os

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from mvsink.pipeline.config import PipelineConfig, read_config
from mvsink.pipeline.decorator import PythonView, failure, line_in, materialized_view
from mvsink.pipeline.graph import ViewGraph, error_line, first_line
from mvsink.pipeline.parse import PipelineError, ViewStatement
from mvsink.table import spark_uri

__all__ = ["Pipeline", "PipelineError", "load_pipeline", "materialized_view", "read_config"]


class Pipeline:
    def __init__(self, config: PipelineConfig, graph: ViewGraph, keys: dict[str, tuple[str, ...]]):
        self.config = config
        self.graph = graph
        #: view -> its key columns as its query spells them.
        self.keys = keys

    def view_specs(self) -> list[dict]:
        """One view specification per view, in dependency order."""
        config = self.config
        return [{"view_id": name, "target": config.targets[name], "key": list(self.keys[name]),
                 "sources": dict(config.sources), "timeline": config.timeline, "input": self._input(name),
                 "base_dir": str(config.path.parent.absolute()), **config.settings[name]}
                for name in self.graph.order]

    def _input(self, name: str) -> dict:
        """``name``'s input: one SQL query over the sources where it and the views it reads are
        all SQL; else its own code, with the views it reads to compute first."""
        views, upstream = self.config.views, self.graph.upstream(name)
        if not any(isinstance(views[v], PythonView) for v in [name, *upstream]):
            return {"kind": "snapshot", "sql": self.graph.query_over_sources(name)}
        return {"kind": "snapshot", **_code(views[name]), "views": [{"name": v, **_code(views[v])} for v in upstream]}


def _code(view: ViewStatement | PythonView) -> dict:
    return {"query": view.reference} if isinstance(view, PythonView) else {"sql": view.query}


def load_pipeline(spark: SparkSession, path: str | os.PathLike) -> Pipeline:
    """The pipeline at ``path`` (its folder or YAML file), checked (see the module doc)."""
    config = read_config(path)
    graph = ViewGraph(spark, config)
    return Pipeline(config, graph, _analyzed_keys(spark, config, graph))


def _analyzed_keys(spark: SparkSession, config: PipelineConfig, graph: ViewGraph) -> dict[str, tuple[str, ...]]:
    """Each view's key columns as its query names them, the queries analyzed in dependency order
    over the sources' latest versions (in a session of their own: no temp view leaks)."""
    session = spark.newSession()
    for name, path in config.sources.items():
        try:
            session.read.format("delta").load(spark_uri(path)).createOrReplaceTempView(name)
        except AnalysisException as exc:
            raise PipelineError(f"{config.path}: source {name}: no Delta table at {path}: {first_line(exc)}") from None
    keys = {}
    for name in graph.order:
        view = config.views[name]
        rows = _analyzed(session, name, view)
        rows.createOrReplaceTempView(name)
        columns = {c.lower(): c for c in rows.columns}
        missing = [k for k in view.key if k.lower() not in columns]
        if missing:
            raise PipelineError(f"{view.where}: view {name}: KEY column(s) {', '.join(missing)} not "
                                f"produced by its {'function' if isinstance(view, PythonView) else 'query'} "
                                f"(its columns: {', '.join(rows.columns)})")
        keys[name] = tuple(columns[k.lower()] for k in view.key)
    return keys


def _analyzed(session: SparkSession, name: str, view: ViewStatement | PythonView) -> DataFrame:
    """``view``'s rows over the sources and views registered in ``session`` (analyzed, not run)."""
    if isinstance(view, ViewStatement):
        try:
            return session.sql(view.located_query())
        except AnalysisException as exc:
            raise PipelineError(f"{error_line(view, exc)}: view {name}: its query cannot be analyzed: "
                                f"{first_line(exc)}") from None
    try:
        rows = view.function(**{p: session.table(p) for p in view.parameters})
    except Exception as exc:
        raise PipelineError(f"{view.file}:{line_in(view.file, exc, view.line)}: view {name}: its function "
                            f"fails over the sources' current rows: {failure(exc)}") from None
    if not isinstance(rows, DataFrame):
        raise PipelineError(f"{view.where}: view {name}: its function returned {type(rows).__name__}, "
                            "not a DataFrame")
    return rows
