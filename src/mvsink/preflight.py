"""The checks of a job's or command's input that need no Spark, run before Spark starts.

Starting Spark takes tens of seconds; a typo should not. :func:`check_view` and
:func:`check_pipeline` refuse, with a :class:`~mvsink.view.ConfigError` naming what is wrong,
everything that can be found from the files alone: the YAML and its settings, an input's kind,
functions that do not import, a pipeline's SQL headers, Python views and names, and a source
that is no Delta table (its ``_delta_log`` is read directly, as :mod:`mvsink.table` does).

Invariants: nothing here starts a JVM or writes anything. What needs Spark's parser or analyzer
(a pipeline query that does not parse, a table it reads that is neither a source nor a view, a
column that does not exist) is still checked when the job loads the pipeline, with the same
exit code (2) and nothing written.
"""

from __future__ import annotations

import argparse
import os

from mvsink.table import latest_version
from mvsink.view import ConfigError, ViewDefinition, view_from_spec


def check_view(spec: dict) -> ViewDefinition:
    """The view ``spec`` defines (as :func:`mvsink.view.view_from_spec`), its sources checked."""
    view = view_from_spec(spec, read_only=True)
    check_sources(view.sources, f"view {view.view_id!r}")
    return view


def check_pipeline(path: str | os.PathLike):
    """The pipeline's configuration (:func:`mvsink.pipeline.read_config`), its sources checked."""
    from mvsink.pipeline.config import read_config

    config = read_config(path)
    check_sources(config.sources, str(config.path))
    return config


def check_sources(sources: dict[str, str], where: str) -> None:
    """Every source is a Delta table (has a committed version)."""
    for name, path in sources.items():
        if latest_version(path) is None:
            raise ConfigError(f"{where}: source {name} ({path}) is not a Delta table (no _delta_log with a commit)")


def positive_seconds(text: str) -> float:
    """``--trigger-seconds``: a positive number of seconds (an ``argparse`` type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value
