"""``mvsink explain --pipeline DIR`` and ``mvsink status --pipeline DIR``: a pipeline in words.

Explain shows each view in dependency order (where it is defined, its level, key, target, what it
reads, the strategy its changes get and why, as ``mvsink explain view.yaml`` says it) and the graph
as a Mermaid flowchart; it loads the pipeline as a job would, so it is also the check that the
pipeline would start. Status reads each view's table and the timeline alone
(:func:`mvsink.target.status.table_status`, no Spark), a view not written yet said so.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from mvsink.desired.choose import strategy
from mvsink.pipeline import Pipeline
from mvsink.pipeline.config import PipelineConfig
from mvsink.target.status import table_status
from mvsink.view import ConfigError, view_from_spec


def explain(spark: SparkSession, pipeline: Pipeline) -> str:
    """The pipeline in words (see the module doc)."""
    config, graph = pipeline.config, pipeline.graph
    strategies = {spec["view_id"]: strategy(spark, view_from_spec(spec, read_only=True, replica_id="explain"))
                  for spec in pipeline.view_specs()}
    lines = [f"pipeline {config.path}: {len(config.sources)} sources, {len(graph.order)} views, "
             f"timeline {config.timeline}"]
    lines += [f"  source {name}: {path}" for name, path in config.sources.items()]
    for name in graph.order:
        view = config.views[name]
        key = f"key ({', '.join(pipeline.keys[name])})" if pipeline.keys[name] else "no key (the whole row)"
        lines.append(f"  view {name} ({view.where}): level {graph.level(name)}, {key} -> {config.targets[name]}")
        lines.append(f"    reads {', '.join(graph.reads[name])}")
        lines.append(f"    {strategies[name]}")
    return "\n".join(lines + ["", "```mermaid", graph.mermaid(), "```"])


def pipeline_status(config: PipelineConfig) -> dict[str, dict | str]:
    """view -> its state read from its table, or why there is none yet."""
    states: dict[str, dict | str] = {}
    for name in config.views:
        try:
            states[name] = table_status(config.targets[name], name, config.timeline)
        except ConfigError as exc:
            states[name] = str(exc)
    return states
