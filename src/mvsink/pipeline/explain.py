"""``mvsink explain --pipeline DIR`` and ``mvsink status --pipeline DIR``: a pipeline in words.

Explain shows each view in dependency order (where it is defined, its level, key, target, what it
reads) and the graph as a Mermaid flowchart; it loads the pipeline as a job would, so it is also
the check that the pipeline would start. Status reads each view's table and the timeline alone
(:func:`mvsink.target.status.table_status`, no Spark), a view not written yet said so.
"""

from __future__ import annotations

from mvsink.pipeline import Pipeline
from mvsink.pipeline.config import PipelineConfig
from mvsink.target.status import table_status
from mvsink.view import ConfigError


def explain(pipeline: Pipeline) -> str:
    config, graph = pipeline.config, pipeline.graph
    lines = [f"pipeline {config.path}: {len(config.sources)} sources, {len(graph.order)} views, "
             f"timeline {config.timeline}"]
    lines += [f"  source {name}: {path}" for name, path in config.sources.items()]
    for name in graph.order:
        view = config.views[name]
        key = f"key ({', '.join(pipeline.keys[name])})" if pipeline.keys[name] else "no key (the whole row)"
        lines.append(f"  view {name} ({view.where}): level {graph.level(name)}, {key} -> {config.targets[name]}")
        lines.append(f"    reads {', '.join(graph.reads[name])}")
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
