"""Shared fixtures: one SparkSession for the whole run (Spark is slow to start)."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(scope="session")
def spark():
    from mvsink.spark import spark_session

    session = spark_session("mvsink-tests")
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
