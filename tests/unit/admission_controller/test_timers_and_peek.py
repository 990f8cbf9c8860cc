"""ManualTimers / LoopTimers / EarliestTimer, and the peek additions to FairShareQueue and PriorityQueue."""

import asyncio
import time

from admission.fair_share import FairShareQueue
from admission.priority_queue import PriorityQueue
from admission.timers import EarliestTimer, LoopTimers, ManualTimers
from core.clock import FakeClock, SystemClock


def test_manual_timers_fire_in_deadline_order_only_when_due() -> None:
    clock = FakeClock()
    timers = ManualTimers(clock)
    fired: list[str] = []
    timers.call_at(2.0, lambda: fired.append("b"))
    timers.call_at(1.0, lambda: fired.append("a"))
    cancelled = timers.call_at(1.5, lambda: fired.append("never"))
    cancelled.cancel()
    assert timers.pending == 2 and timers.next_when_s() == 1.0
    assert timers.advance(0.5) == 0 and fired == []
    assert timers.advance(1.5) == 2 and fired == ["a", "b"]
    timers.call_at(0.0, lambda: fired.append("past"))  # already due: runs at the next run_due
    assert timers.run_due() == 1 and fired[-1] == "past" and timers.pending == 0


async def test_loop_timers_fire_on_the_running_loop() -> None:
    clock = SystemClock()
    fired = asyncio.Event()
    started_s = time.monotonic()
    LoopTimers(clock).call_at(clock.now_s() + 0.02, fired.set)
    cancelled = asyncio.Event()
    LoopTimers(clock).call_at(clock.now_s() + 0.01, cancelled.set).cancel()
    await asyncio.wait_for(fired.wait(), timeout=2.0)
    assert time.monotonic() - started_s >= 0.015 and not cancelled.is_set()


def test_earliest_timer_re_arms_only_for_an_earlier_deadline_and_cancels_on_none() -> None:
    clock = FakeClock()
    timers = ManualTimers(clock)
    fired: list[float] = []
    timer = EarliestTimer(timers, lambda: fired.append(clock.now_s()))
    timer.arm(5.0)
    timer.arm(7.0)  # later: the pending 5 s timer stays, no second one
    assert timers.pending == 1 and timers.next_when_s() == 5.0
    timer.arm(3.0)  # earlier: replaces it
    assert timers.pending == 1 and timers.next_when_s() == 3.0
    timers.advance(3.0)
    assert fired == [3.0] and timers.pending == 0
    timer.arm(4.0)  # after firing, any deadline arms a new timer
    assert timers.next_when_s() == 4.0
    timer.arm(None)
    assert timers.pending == 0
    timers.advance(5.0)
    assert fired == [3.0]


def test_fair_share_peek_matches_pop_and_skips_removed_keys() -> None:
    fair = FairShareQueue()
    assert fair.peek() is None
    fair.push(1, "a", 100.0)
    fair.push(2, "b", 10.0)
    assert fair.peek() == 2 and len(fair) == 2  # left in place
    fair.remove(2)
    assert fair.peek() == 1 and fair.pop() == 1 and fair.peek() is None


def test_priority_queue_peek_next_is_what_pop_next_returns_and_skips_expired() -> None:
    clock = FakeClock()
    queue: PriorityQueue[str] = PriorityQueue(clock)
    queue.push("i-old", "interactive")
    clock.advance(5.0)
    queue.push("b", "batch")
    queue.push("i-new", "interactive")
    head = queue.peek_next()
    assert head is not None and head.item == "i-old" and len(queue) == 3
    assert queue.pop_next() is head
    clock.advance(10.0)  # i-new (deadline 15 s) expired: passed over, still there for expire()
    head = queue.peek_next()
    assert head is not None and head.item == "b"
    assert [entry.item for entry in queue.expire()] == ["i-new"]
    assert queue.pop_next() is head and queue.peek_next() is None
