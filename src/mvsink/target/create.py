"""The target table: created on a view's first write, checked against the view at every start.

The table is created by delta-rs in the view's layout (:mod:`mvsink.target.layout`: the view's columns,
or its updates' columns), recorded in its ``mvsink.layout`` property, and no partitioning. A replica that finds the table already there (another replica made it, or an
older run) checks that its columns and types are the view's; a mismatch stops the replica before
it writes anything.
"""

from __future__ import annotations

import logging

from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from mvsink import storage
from mvsink.target.guard import allows_deletion_vectors
from mvsink.target.layout import LAYOUT_PROPERTY, TABLE, stored_schema
from mvsink.table import latest_version, spark_uri
from mvsink.view import ConfigError, ViewDefinition
from mvsink.append.fence import initial_properties

log = logging.getLogger(__name__)


def validate_target(spark: SparkSession, view: ViewDefinition, schema: T.StructType, layout: str) -> None:
    """Raise :class:`ConfigError` if the existing target's schema is not what the view's updates
    (``schema``) are stored as in ``layout``."""
    if latest_version(view.target) is None:
        return
    if view.deletion_vectors == "on" and not allows_deletion_vectors(
            DeltaTable(storage.delta_uri(view.target), storage_options=storage.storage_options(view.target))):
        raise ConfigError(f"view {view.view_id!r} says deletion_vectors: on, but its target {view.target} does "
                          f"not allow them: ALTER TABLE delta.`{view.target}` SET TBLPROPERTIES "
                          "(delta.enableDeletionVectors = true), or say auto (follow the table) or off")
    schema = stored_schema(layout, schema)
    actual = spark.read.format("delta").load(spark_uri(view.target)).schema
    want = {f.name: f.dataType for f in schema.fields}
    have = {f.name: f.dataType for f in actual.fields}
    problems = [f"missing column {n} {t.simpleString()}" for n, t in want.items() if n not in have]
    problems += [f"unexpected column {n} {t.simpleString()}" for n, t in have.items() if n not in want]
    problems += [
        f"column {n} is {have[n].simpleString()}, the view has {t.simpleString()}"
        for n, t in want.items() if n in have and have[n] != t
    ]
    if problems:
        raise ConfigError(
            f"target {view.target} does not match view {view.view_id!r}: " + "; ".join(problems)
        )


def create_target(view: ViewDefinition, schema: T.StructType, layout: str | None = None) -> None:
    """Create the target table for updates in ``schema`` in ``layout`` (default: the view's, else
    ``table``), unless another replica got there first."""
    layout = layout or view.layout or TABLE
    configuration = {LAYOUT_PROPERTY: layout, **initial_properties(view, schema)}
    if view.deletion_vectors == "on":
        configuration["delta.enableDeletionVectors"] = "true"
    try:
        DeltaTable.create(
            storage.delta_uri(view.target), schema=to_arrow_schema(stored_schema(layout, schema)),
            mode="ignore", name=view.view_id, description=f"mvsink view {view.view_id}",
            configuration=configuration,
            raise_if_key_not_exists=False,
            storage_options=storage.storage_options(view.target),
        )
        log.info("created target table %s (%s layout%s)", view.target, layout,
                 ", deletion vectors" if view.deletion_vectors == "on" else "")
    except Exception:
        if latest_version(view.target) is None:
            raise
        log.info("target table %s was created by another replica", view.target)
