"""Shared fixtures: one SparkSession for the whole run (Spark is slow to start)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

# Spark's settings for this run and every process it starts (spark-defaults.conf: why, there).
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).parent / "spark-conf"))


@pytest.fixture(scope="session")
def spark():
    from mvsink.spark import spark_session

    # What the run's plans, encoders and status records keep grows to ~1.7 GB over the suite: in
    # the default 2 GB heap the garbage collector ran all the time (~10% of the run's CPU).
    session = spark_session("mvsink-tests", {"spark.driver.memory": "6g"})
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _quiet_py4j():
    logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture
def strategies(monkeypatch) -> list[str]:
    """The strategy of each range of changes that the view under test (``maintained``,
    ``from_feed`` or ``v``; not the view ``recomputed`` beside it) computes."""
    from mvsink.desired import snapshot

    seen, changes = [], snapshot.SnapshotDesired.changes

    def recorded(self, lo, hi):
        computed = changes(self, lo, hi)
        if computed is not None and self.view.view_id in ("maintained", "from_feed", "v"):
            seen.append(computed.strategy)
        return computed

    monkeypatch.setattr(snapshot.SnapshotDesired, "changes", recorded)
    return seen
