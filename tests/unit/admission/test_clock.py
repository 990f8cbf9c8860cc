import pytest

from core.clock import FakeClock, SystemClock


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock(start_s=5.0)
    assert clock.now_s() == 5.0
    assert clock.advance(2.5) == 7.5
    clock.set(10.0)
    assert clock.now_s() == 10.0


def test_fake_clock_refuses_to_go_back() -> None:
    clock = FakeClock(start_s=5.0)
    with pytest.raises(ValueError):
        clock.advance(-0.1)
    with pytest.raises(ValueError):
        clock.set(4.0)


def test_system_clock_is_monotonic() -> None:
    clock = SystemClock()
    first = clock.now_s()
    assert clock.now_s() >= first
