"""``refresh: auto``'s choice between a maintained strategy and full evaluation
(:class:`mvsink.desired.refresh.AutoRefresh`): from the costs per time it is told, which way the next
step takes, and when it tries the other again."""

from __future__ import annotations

from mvsink.desired.refresh import AutoRefresh


def _steps(auto: AutoRefresh, n: int) -> list[bool]:
    return [auto.takes_full() for _ in range(n)]


def test_the_maintained_strategy_is_kept_while_it_costs_less_than_the_hydration():
    auto = AutoRefresh("v")
    assert not auto.takes_full(), "nothing measured: maintained"
    auto.observed(False, 3.0, 1)
    assert not auto.takes_full(), "no full evaluation's cost known yet"
    auto.hydrated(5.0)
    assert _steps(auto, 3) == [False] * 3
    auto.observed(False, 12.0, 2)  # 6 s per time, above the hydration's 5 s and the floor
    assert auto.takes_full()


def test_a_step_under_the_floor_is_not_weighed():
    auto = AutoRefresh("v")
    auto.hydrated(0.5)
    auto.observed(False, 0.9 * AutoRefresh.FLOOR, 1)
    assert not auto.takes_full(), "cheap enough, however the full evaluation compares"


def test_full_evaluation_while_cheaper_and_the_maintained_strategy_retried_every_few_steps():
    auto = AutoRefresh("v")
    auto.hydrated(20.0)
    auto.observed(False, 30.0, 1)
    assert auto.takes_full()
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
    assert auto.full == 2.0 and auto.takes_full()
