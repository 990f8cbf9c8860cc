import pytest

from admission.dispatch_rate import DispatchRateMeter
from core.clock import FakeClock


def test_no_rate_before_the_first_dispatch() -> None:
    meter = DispatchRateMeter(FakeClock())
    assert meter.rate_per_s() is None
    assert meter.dispatched_total == 0


def test_steady_rate_is_measured() -> None:
    clock = FakeClock()
    meter = DispatchRateMeter(clock)
    for _ in range(300):  # 5 per second for 60 s
        clock.advance(0.2)
        meter.record()
    rate = meter.rate_per_s()
    assert rate == pytest.approx(5.0, rel=0.02)
    assert meter.dispatched_total == 300


def test_early_estimate_is_not_biased_low() -> None:
    clock = FakeClock()
    meter = DispatchRateMeter(clock)
    for _ in range(10):  # 5 per second for 2 s, with tau = 10 s
        clock.advance(0.2)
        meter.record()
    assert meter.rate_per_s() == pytest.approx(5.0, rel=0.05)


def test_a_burst_does_not_read_as_a_huge_rate() -> None:
    meter = DispatchRateMeter(FakeClock())
    meter.record(2)
    rate = meter.rate_per_s()
    assert rate is not None and rate < 2.2  # min window 1 s, not 2 per 0 s


def test_rate_decays_while_nothing_is_dispatched() -> None:
    clock = FakeClock()
    meter = DispatchRateMeter(clock)
    for _ in range(100):
        clock.advance(0.1)
        meter.record()
    clock.advance(60)
    rate = meter.rate_per_s()
    assert rate is not None and rate < 0.05


def test_rate_follows_a_change_in_fleet_speed() -> None:
    clock = FakeClock()
    meter = DispatchRateMeter(clock, time_constant_s=5.0)
    for _ in range(600):
        clock.advance(0.1)
        meter.record()
    for _ in range(300):  # halves to 5/s for 30 s = 6 tau
        clock.advance(0.2)
        meter.record()
    assert meter.rate_per_s() == pytest.approx(5.0, rel=0.05)


def test_invalid_arguments_raise() -> None:
    with pytest.raises(ValueError):
        DispatchRateMeter(FakeClock(), time_constant_s=0)
    with pytest.raises(ValueError):
        DispatchRateMeter(FakeClock()).record(-1)
