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
