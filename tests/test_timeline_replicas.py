"""Replicas as separate processes of a view over three sources on one timeline, killed and
restarted at random while every source changes: every time the timeline mints stands for one
version of each source, and the table equals the view computed from exactly those versions."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from deltalake import DeltaTable

from helpers import (Replica, commit_sql, create_source, edit_with_restarts, insert, stop_all, view_upper_of, wait_for,
                     write_config)
from mvsink.check import TimelineReader, caught_up, check_table
from timeline_views import (CUSTOMERS, LINEITEM, ORDERS, ORDERS_LEFT_CUSTOMERS_SQL, ORDERS_WITH_CUSTOMERS_COLUMNS,
                            REVENUE_COLUMNS, Independent)

SOURCE_COMMITS = 24
#: Two replicas killed, one with SIGKILL and one with SIGTERM (a third restart showed nothing new).
RESTARTS = 2
VIEWS = Path(__file__).with_name("timeline_views.py")


def _edit(spark, sources: dict[str, str], rng: random.Random, n: int, next_id: list[int]) -> None:
    """One commit to one source, chosen at random."""
    orders, customers, lineitem = sources["orders"], sources["customers"], sources["lineitem"]
    op = rng.choice(["order", "order", "lines", "customer", "rename", "cancel", "drop-line"])
    if op == "order":
        oid = next_id[0]
        next_id[0] += 1
        insert(spark, orders, [(oid, rng.randint(1, 6), rng.randint(1, 100))])
    elif op == "lines":
        insert(spark, lineitem, [(rng.randint(10, next_id[0]), 10 + n, rng.randint(1, 50))
                                 for _ in range(rng.randint(1, 3))])
    elif op == "customer":
        insert(spark, customers, [(6 + n, f"c{n}", rng.choice(["NL", "FR", "DE"]))])
    elif op == "rename":
        commit_sql(spark, f"UPDATE delta.`{customers}` SET name = concat(name, '+{n}') WHERE id % 3 = {n % 3}")
    elif op == "cancel":
        commit_sql(spark, f"DELETE FROM delta.`{orders}` WHERE id % 5 = {n % 5}")
    else:
        commit_sql(spark, f"DELETE FROM delta.`{lineitem}` WHERE line % 4 = {n % 4}")


# An inner join's replica processes race in test_pipeline_replicas.py (its silver views).
@pytest.mark.parametrize("replicas,view", [(2, "orders_left_customers"), (3, "revenue")])
def test_replicas_of_a_view_over_three_sources_keep_every_time_exact(spark, tmp_path, replicas, view):
    rng = random.Random(2000 + replicas)
    sources = {name: str(tmp_path / name) for name in ("orders", "customers", "lineitem")}
    create_source(spark, sources["customers"], [(i, f"c{i}", "NL" if i % 2 else "FR") for i in range(1, 6)],
                  CUSTOMERS)
    create_source(spark, sources["orders"], [(10 + i, 1 + i % 5, 10 * i) for i in range(8)], ORDERS)
    create_source(spark, sources["lineitem"], [(10 + i, j, i + j) for i in range(8) for j in range(2)], LINEITEM)
    target, timeline = str(tmp_path / view), str(tmp_path / "shop_timeline")
    read = sources
    if view == "orders_left_customers":  # a key join
        spec = {"key": ["id"], "input": {"kind": "snapshot", "sql": ORDERS_LEFT_CUSTOMERS_SQL}}
        columns = ORDERS_WITH_CUSTOMERS_COLUMNS
        read = {name: sources[name] for name in ("orders", "customers")}  # what it reads (lineitem moves apart)
    else:
        spec = {"key": ["customer"], "input": {"kind": "snapshot", "query": f"{VIEWS}:revenue_per_customer"}}
        columns = REVENUE_COLUMNS
    config = write_config(tmp_path / "view.yaml", view_id=view, target=target, sources=read,
                          timeline=timeline, **spec)
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = [Replica(config, f"r{i}", logs).start() for i in range(replicas)]
    restarts = 0
    try:
        wait_for(lambda: view_upper_of(target, view), timeout=240, what="the first commit", watch=tuple(fleet))
        next_id = [100]
        restarts = edit_with_restarts(fleet, rng, SOURCE_COMMITS, RESTARTS,
                                      lambda n: _edit(spark, sources, rng, n, next_id), target, view,
                                      pause=(0.2, 2.0))
        wait_for(lambda: caught_up(target, view, timeline), timeout=300,
                 what="the view to reach every source's latest version", watch=tuple(fleet))
    finally:
        stop_all(fleet)

    said = "".join(log.read_text() for log in logs.glob("*.log"))
    strategy = {"orders_left_customers": "by per-key recompute", "revenue": "by per-group recompute"}[view]
    assert strategy in said, f"no step logged {strategy!r}"
    reader = TimelineReader(timeline)
    upper = DeltaTable(timeline).transaction_version("mvsink:timeline")
    versions = [reader.versions(t) for t in range(upper)]
    assert versions[-1] == {name: DeltaTable(path).version() for name, path in read.items()}
    for before, after in zip(versions, versions[1:]):
        assert all(after[s] >= before[s] for s in read), "no source goes back in time"
    independent = Independent(timeline, sources)
    expected = getattr(independent, view)
    result = check_table(target, view, columns, expected)
    print(f"{replicas} replicas of {view}, {restarts} restarts, {SOURCE_COMMITS} source commits, "
          f"{upper} times: {result.summary()}")
    assert result.ok, result.problems[:5]
    assert restarts == RESTARTS
    assert result.times_checked >= upper
    # One time covers every source commit since the last, so how many times there are depends on
    # how fast the replicas step (6 to 8 for 24 commits, on a loaded or an idle machine).
    assert upper > 3, "times follow the sources"
    writers = {replica for _, _, reason, replica in result.commits if reason != "advance-upper"}
    assert len(writers) >= 2, f"only {writers} ever won a commit: the replicas did not race"
    minters = {info.get("mvsink.replica") for info in DeltaTable(timeline).history() if "mvsink.entry" in info}
    assert len(minters) >= 2, f"only {minters} ever minted a time: the replicas did not race on the timeline"
