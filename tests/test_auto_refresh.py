"""``refresh: auto``'s choice between a maintained strategy and full evaluation
(:class:`mvsink.desired.refresh.AutoRefresh`): from the share of the sources a step's change is and
the costs per time it is told, which way the next step takes and why, and when it tries the other again."""

from __future__ import annotations

from mvsink.desired.change_size import ChangeSize
from mvsink.desired.refresh import AutoRefresh


#: Sources large enough for their change's share to count.
_LARGE = AutoRefresh.SHARE_MIN_BYTES


def _size(share: float, sources: int = _LARGE) -> ChangeSize:
    return ChangeSize(int(share * sources), sources)


def _full(auto: AutoRefresh, size: ChangeSize | None = None) -> bool:
    return auto.full_instead(size, 1) is not None


def _steps(auto: AutoRefresh, n: int) -> list[bool]:
    return [_full(auto) for _ in range(n)]


def test_the_maintained_strategy_is_kept_while_it_costs_less_than_the_hydration():
    auto = AutoRefresh("v")
    assert not _full(auto), "nothing measured: maintained"
    auto.observed(False, 3.0, 1)
    assert not _full(auto), "no full evaluation's cost known yet"
    auto.hydrated(5.0)
    assert _steps(auto, 3) == [False] * 3
    auto.observed(False, 12.0, 2)  # 6 s per time, above the hydration's 5 s and the floor
    assert _full(auto)


def test_a_step_under_the_floor_is_not_weighed():
    auto = AutoRefresh("v")
    auto.hydrated(0.5)
    auto.observed(False, 0.9 * AutoRefresh.FLOOR, 1)
    assert not _full(auto), "cheap enough, however the full evaluation compares"


def test_full_evaluation_while_cheaper_and_the_maintained_strategy_retried_every_few_steps():
    auto = AutoRefresh("v")
    auto.hydrated(20.0)
    auto.observed(False, 30.0, 1)
    assert _full(auto)
    auto.observed(True, 8.0, 2)  # 4 s per evaluation (one for the time before, none being kept)
    assert auto.full == 4.0
    taken = _steps(auto, 2 * AutoRefresh.RETRY - 1)
    assert taken.count(False) == 2 and not taken[AutoRefresh.RETRY - 2], taken  # the 10th and 20th: tried again
    auto.observed(False, 3.5, 1)  # the change got smaller: maintained is cheaper again
    assert _steps(auto, 2 * AutoRefresh.RETRY) == [False] * (2 * AutoRefresh.RETRY)


def test_a_later_hydration_does_not_replace_a_measured_full_evaluation():
    auto = AutoRefresh("v")
    auto.observed(True, 2.0, 1)
    auto.hydrated(50.0)
    auto.observed(False, 6.0, 1)
    assert auto.full == 2.0 and _full(auto)


def test_a_change_above_the_share_is_evaluated_in_full_before_any_cost_is_known():
    auto, limit = AutoRefresh("v", 3), AutoRefresh.JOIN_SHARE
    fallback = auto.full_instead(_size(2 * limit), 1)
    assert fallback is not None and fallback.kind == "change share", fallback
    assert f"{2 * limit:.1%} of its sources' bytes" in fallback.why, fallback.why
    assert auto.full_instead(_size(limit), 1) is None, "at the share: maintained"
    assert auto.full_instead(_size(2 * limit), 2) is None, "over two times: the share per time"
    assert auto.full_instead(_size(0.9, _LARGE - 1), 1) is None, "small sources: their share does not count"
    assert auto.full_instead(None, 1) is None, "size not known: the costs decide, none measured"
    one = AutoRefresh("v", 1)
    assert AutoRefresh.ONE_SOURCE_SHARE > limit and one.share_limit == AutoRefresh.ONE_SOURCE_SHARE
    assert one.full_instead(_size(2 * limit), 1) is None, "over one source, a step reads only its change"
    assert one.full_instead(_size(1.0), 1).kind == "change share"


def test_a_small_change_still_falls_back_by_cost_and_a_large_one_leaves_the_retries_alone():
    auto = AutoRefresh("v")
    auto.hydrated(4.0)
    auto.observed(False, 2 * AutoRefresh.FLOOR, 1)
    fallback = auto.full_instead(_size(AutoRefresh.ONE_SOURCE_SHARE / 10), 1)
    assert fallback is not None and fallback.kind == "cost", fallback
    assert "4.00s per time, maintained 10.00s" in fallback.why, fallback.why
    # large changes are taken in full without counting towards the retry of the maintained strategy
    assert all(auto.full_instead(_size(1.0), 1).kind == "change share" for _ in range(3 * AutoRefresh.RETRY))
    taken = _steps(auto, AutoRefresh.RETRY - 1)
    assert taken == [True] * (AutoRefresh.RETRY - 2) + [False], taken


def test_a_large_change_under_auto_is_evaluated_in_full_says_why_and_the_next_small_one_is_maintained(
        spark, tmp_path, monkeypatch):
    """A view over real Delta sources: a step whose change passes the share (here 50%, the sources'
    least size 0 so that small tables count) is evaluated in full without a maintained step first,
    and its report, log line and metrics say so and why; the steps around it are maintained; at
    every step the view is the query's result."""
    from collections import Counter

    from helpers import create_source, insert
    from mvsink import MaterializedView, SnapshotInput, ViewDefinition, read_view
    from mvsink.desired import snapshot
    from mvsink.metrics import render

    monkeypatch.setattr(AutoRefresh, "SHARE_MIN_BYTES", 0)
    monkeypatch.setattr(AutoRefresh, "JOIN_SHARE", 0.5)
    maintained, from_feed = [], snapshot.SnapshotDesired._aggregate_changes
    monkeypatch.setattr(snapshot.SnapshotDesired, "_aggregate_changes",
                        lambda self, times: (maintained.append(times), from_feed(self, times))[1])
    orders, customers = str(tmp_path / "orders"), str(tmp_path / "customers")
    create_source(spark, orders, [(i, i % 4, i % 7) for i in range(2000)], "id BIGINT, cust BIGINT, amount BIGINT")
    create_source(spark, customers, [(c, "abcd"[c]) for c in range(4)], "cust BIGINT, segment STRING")
    sql = ("SELECT c.segment, count(*) AS n, sum(o.amount) AS total FROM orders o JOIN customers c "
           "ON o.cust = c.cust GROUP BY c.segment")
    view = ViewDefinition("v", str(tmp_path / "v"), SnapshotInput(sql=sql), key=("segment",),
                          sources={"orders": orders, "customers": customers}, replica_id="r1")
    mv = MaterializedView(spark, view)
    mv.run_until_caught_up()

    def step_against_the_query():
        report = mv.step()
        mv.run_until_caught_up()
        for name, path in view.sources.items():
            spark.read.format("delta").load(path).createOrReplaceTempView(name)
        assert Counter(map(tuple, read_view(spark, view.target, "v").collect())) == Counter(
            map(tuple, spark.sql(sql).collect()))
        return report

    insert(spark, orders, [(5000, 1, 3), (5001, 2, 4)])
    small = step_against_the_query()
    assert small.strategy == "linear aggregate" and small.fallback is None, small
    assert 0 < small.change_share < 0.5 and len(maintained) == 1, small
    spark.sql(f"UPDATE delta.`{orders}` SET amount = amount + 1")  # every row: its pre- and post-images
    large = step_against_the_query()
    assert large.strategy == "full evaluation" and large.fallback.kind == "change share", large
    assert large.change_share > 0.5 and len(maintained) == 1, "no maintained step before the full evaluation"
    assert "its change is" in str(large) and "above auto's 50%" in str(large), str(large)
    insert(spark, orders, [(5002, 3, 1)])
    after = step_against_the_query()
    assert after.strategy == "linear aggregate" and after.fallback is None and len(maintained) == 2, after
    text = render({"v": mv})
    assert 'mvsink_steps_evaluated_in_full_total{view="v",replica="r1",reason="change share"} 1' in text, text
    assert f'mvsink_change_share{{view="v",replica="r1"}} {after.change_share:.6g}' in text, text
    assert small.in_process and not large.in_process and after.in_process, "small steps' terms computed in the driver"
    assert "(terms and groups in process)" in str(after) and "in process" not in str(large), str(after)
    assert 'mvsink_steps_in_process_total{view="v",replica="r1"} 2' in text, text
