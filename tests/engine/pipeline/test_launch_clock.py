"""LaunchClock: when the next pass is packed (engine/pipeline/launch_clock.py), on a fake clock."""

import pytest

from engine.pipeline.launch_clock import EMA_WEIGHT, MARGIN_FACTOR, MARGIN_S, LaunchClock


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_nothing_observed_packs_at_once():
    assert LaunchClock().pack_at(5.0, 16384) is None
    LaunchClock().wait_until(None, lambda: False)  # returns at once


def test_the_pass_end_predicted_from_seconds_per_token_less_the_launch_margin():
    clock = LaunchClock()
    clock.observe(16384, 0.55)
    clock.launched(0.08)
    margin = 0.08 * MARGIN_FACTOR + MARGIN_S
    assert clock.pack_at(10.0, 16384) == pytest.approx(10.0 + 0.55 - margin)
    assert clock.pack_at(10.0, 8192) == pytest.approx(10.0 + 0.275 - margin)  # half the tokens, half the time


def test_observations_are_averaged_with_the_newest_weighted():
    clock = LaunchClock()
    clock.observe(1000, 1.0)
    clock.observe(1000, 2.0)
    assert clock.seconds_per_token == pytest.approx((1.0 + EMA_WEIGHT * (2.0 - 1.0)) / 1000)
    clock.observe(0, 3.0)  # an empty pass teaches nothing
    assert clock.seconds_per_token == pytest.approx((1.0 + EMA_WEIGHT) / 1000)


def test_waits_doing_host_work_while_a_step_fits_then_sleeps_to_the_deadline():
    time = FakeTime()
    clock = LaunchClock(time.clock, time.sleep)
    steps = []

    def step() -> bool:
        steps.append(time.now)
        time.now += 0.010
        return True

    clock.wait_until(100.1, lambda: False, step)
    assert time.now >= 100.1
    assert time.now - 100.1 < 0.010, "a step ran past the deadline"
    assert len(steps) >= 8 and clock.step_s == pytest.approx(0.010)
    assert all(s <= 0.001 + 1e-12 for s in time.slept)


def test_stops_waiting_when_the_pass_is_done_or_the_work_runs_out():
    time = FakeTime()
    clock = LaunchClock(time.clock, time.sleep)
    done_at = 100.05
    clock.wait_until(101.0, lambda: time.now >= done_at)
    assert done_at <= time.now < done_at + 0.002
    calls = []
    time.now = 200.0
    clock.wait_until(200.02, lambda: False, lambda: calls.append(1) or False)  # no more work: sleeps
    assert calls == [1] and time.now >= 200.02
