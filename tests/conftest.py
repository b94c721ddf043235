"""Shared fixtures: one SparkSession per test process (Spark is slow to start).

The run is split over two test processes (pytest-xdist, ``-n 2 --dist loadfile`` in
pyproject.toml), a file's tests on one of them, in their order (its module fixtures are made
once): with one process, sampled with jstack, the JVM had neither its driver thread nor a task
running ~30% of the time, and the machine's second core sat idle."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

# Spark's settings for this run and every process it starts (spark-defaults.conf: why, there).
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).parent / "spark-conf"))


#: The files that take longest, longest first (seconds of one test process in a run of 1b493c7,
#: junit times, the machine partly loaded): the test processes start on them, and the run ends
#: on short files rather than one process busy with a long file while the other has nothing left
#: (``--no-loadscope-reorder`` in pyproject.toml keeps this order). Other files follow in theirs.
LONGEST_FIRST = (
    "test_in_process.py",          # 871 s
    "test_per_key.py",             # 775 s
    "test_engine_defects.py",      # 515 s (an OutOfMemoryError's fallback and retries in it)
    "test_per_group.py",           # 470 s
    "test_differential.py",        # 445 s
    "test_linear_aggregate.py",    # 417 s
    "test_join.py",                # 313 s
    "test_outer_join.py",          # 307 s
    "test_timeline_replicas.py",   # 295 s, replica processes
    "test_cluster.py",             # 250 s, a standalone cluster
    "test_aggregate_top.py",       # 234 s
    "test_row_wise.py",            # 228 s
    "test_pipeline_replicas.py",   # 192 s, replica processes
    "test_replicas.py",            # 173 s, replica processes
    "test_union.py",               # 139 s
    "test_fencing.py",             # 136 s, replica processes
    "test_cutover.py",             # 130 s, replica processes
    "test_pipeline.py",            # 128 s
    "test_log_changes.py",         # 103 s
    "test_crash.py",               # 98 s, replica processes
    "test_plan.py",                # 75 s alone (336 s in that run: a status it waited for never came)
)


def pytest_collection_modifyitems(items):
    """Items of :data:`LONGEST_FIRST`'s files first, in its order; a file's own order kept."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def spark():
    from mvsink.spark import spark_session

    # What a serial run's plans, encoders and status records kept grew to ~1.7 GB over the suite:
    # in the default 2 GB heap the garbage collector ran all the time (~10% of the run's CPU).
    # Each of the two test processes runs about half of the suite.
    # Both JIT compilers for this long-lived JVM (spark-defaults.conf gives the processes it starts C1 alone).
    # The status a session keeps of its last SQL executions, jobs, stages and tasks (plans'
    # descriptions and metrics; kept with the UI off too): a few of each, not a thousand.
    retained = {"spark.sql.ui.retainedExecutions": "20", "spark.ui.retainedJobs": "50",
                "spark.ui.retainedStages": "50", "spark.ui.retainedTasks": "1000"}
    session = spark_session("mvsink-tests", {"spark.driver.memory": "4g",
                                             "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4", **retained})
    yield session
    session.stop()


@pytest.fixture(scope="module", autouse=True)
def _release_a_files_data():
    """After each file (its module fixtures gone): the blocks its views persisted or checkpointed
    locally released. Left to Spark's cleaner, they waited for both garbage collectors, and late
    in a run the session's heap was full (an OutOfMemoryError serializing a task)."""
    yield
    import gc

    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is None:
        return
    session.catalog.clearCache()
    for rdd in list(session.sparkContext._jsc.getPersistentRDDs().values()):
        rdd.unpersist(False)
    gc.collect()
    session.sparkContext._jvm.System.gc()


@pytest.fixture(autouse=True)
def _quiet_py4j():
    logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture
def strategies(monkeypatch) -> list[str]:
    """The strategy of each range of changes that the view under test (``maintained``,
    ``from_feed`` or ``v``; not the view ``recomputed`` beside it) computes."""
    seen: list[str] = []
    _record_changes(monkeypatch, lambda computed: seen.append(computed.strategy))
    return seen


@pytest.fixture
def changes_computed(monkeypatch) -> list:
    """Each range of changes (:class:`~mvsink.desired.changes.Changes`) the view under test computes."""
    seen: list = []
    _record_changes(monkeypatch, seen.append)
    return seen


def _record_changes(monkeypatch, record) -> None:
    """Has ``record`` called with each range of changes the view under test computes."""
    from mvsink.desired import snapshot

    changes = snapshot.SnapshotDesired.changes

    def recorded(self, lo, hi):
        computed = changes(self, lo, hi)
        if computed is not None and self.view.view_id in ("maintained", "from_feed", "v"):
            record(computed)
        return computed

    monkeypatch.setattr(snapshot.SnapshotDesired, "changes", recorded)
