"""`WriteDeadlines`: one timer watches every client send under way, and a finished send leaves nothing
in it (a fake clock and manual timers: no sleeping)."""

from __future__ import annotations

import gc
import weakref

from admission.timers import ManualTimers
from core.clock import FakeClock
from gateway.api.write_deadline import WriteDeadlines

TIMEOUT_S = 30.0


class FakeSender:
    def __init__(self) -> None:
        self.expired = 0

    def write_expired(self) -> None:
        self.expired += 1


def _deadlines() -> tuple[WriteDeadlines, FakeClock, ManualTimers]:
    clock = FakeClock()
    timers = ManualTimers(clock)
    return WriteDeadlines(TIMEOUT_S, clock, timers), clock, timers


def test_a_send_that_does_not_return_is_ended_at_its_deadline_and_not_before() -> None:
    deadlines, _, timers = _deadlines()
    sender = FakeSender()
    deadlines.begin(sender)
    timers.advance(TIMEOUT_S - 0.001)
    assert sender.expired == 0
    timers.advance(0.001)
    assert sender.expired == 1 and deadlines.under_way == 0 and timers.pending == 0


def test_many_sends_share_one_timer_and_a_quiet_watch_has_none() -> None:
    deadlines, clock, timers = _deadlines()
    senders = [FakeSender() for _ in range(1000)]
    for sender in senders:
        deadlines.begin(sender)
        clock.advance(0.001)
        deadlines.end(sender)
    assert timers.pending == 1 and deadlines.under_way == 0
    timers.advance(TIMEOUT_S)  # the one timer fires, finds no send under way and is not re-armed
    assert timers.pending == 0 and not any(sender.expired for sender in senders)


def test_the_timer_re_arms_for_the_oldest_send_still_under_way() -> None:
    deadlines, clock, timers = _deadlines()
    first, second, third = FakeSender(), FakeSender(), FakeSender()
    deadlines.begin(first)
    clock.advance(10.0)
    deadlines.begin(second)
    clock.advance(10.0)
    deadlines.begin(third)
    deadlines.end(first)  # taken: only second and third wait
    timers.advance(TIMEOUT_S - 20.0)  # first's deadline: nothing due, re-armed for second's
    assert (first.expired, second.expired, third.expired) == (0, 0, 0) and timers.pending == 1
    timers.advance(10.0)
    assert (second.expired, third.expired) == (1, 0)
    deadlines.end(third)
    timers.advance(TIMEOUT_S)
    assert third.expired == 0 and timers.pending == 0


def test_a_sender_that_sends_again_gets_a_fresh_deadline() -> None:
    deadlines, clock, timers = _deadlines()
    sender = FakeSender()
    deadlines.begin(sender)
    clock.advance(20.0)
    deadlines.end(sender)
    deadlines.begin(sender)
    timers.advance(TIMEOUT_S - 20.0)  # the first send's deadline passes: the second is 20 s younger
    assert sender.expired == 0
    timers.advance(20.0)
    assert sender.expired == 1


def test_a_finished_send_is_not_referenced_by_the_watch() -> None:
    deadlines, _, timers = _deadlines()
    sender = FakeSender()
    deadlines.begin(sender)
    deadlines.end(sender)
    ref = weakref.ref(sender)
    del sender
    gc.collect()
    assert ref() is None and timers.pending == 1  # the pending timer holds the watch, not the sender
