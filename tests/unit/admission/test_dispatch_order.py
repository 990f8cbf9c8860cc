"""Walking the queue in dispatch order and taking any waiter (what the pump needs to pass over holds)."""

from __future__ import annotations

import random

from admission.fair_share import FairShareQueue
from admission.priority_queue import PriorityQueue
from core.clock import FakeClock


def test_fair_share_in_order_is_the_pop_order_and_skips_removed_keys() -> None:
    rng = random.Random(3)
    fair, twin = FairShareQueue(), FairShareQueue()
    for key in range(200):
        tenant, cost, weight = f"t{rng.randrange(5)}", rng.uniform(1, 500), rng.choice([1.0, 2.0])
        fair.push(key, tenant, cost, weight)
        twin.push(key, tenant, cost, weight)
    for key in range(0, 200, 7):
        fair.remove(key)
        twin.remove(key)
    walked = list(fair.in_order())
    popped = [key for key in iter(twin.pop, None)]
    assert walked == popped and len(fair) == len(walked)  # walking removes nothing


def test_taking_a_later_key_keeps_the_passed_over_ones_ahead_of_newcomers() -> None:
    fair = FairShareQueue()
    fair.push(1, "a", 100)  # finish tag 100
    fair.push(2, "b", 300)  # finish tag 300
    assert fair.take(2) and not fair.take(2)
    assert fair.virtual_time == 300  # as if popped
    fair.push(3, "c", 10)  # a newcomer starts at V = 300: behind key 1 (tag 100)
    assert list(fair.in_order()) == [1, 3]
    assert fair.take(1) and fair.virtual_time == 300  # V never goes back


def test_in_order_tolerates_takes_while_walking() -> None:
    fair = FairShareQueue()
    for key in range(10):
        fair.push(key, "t", 10)
    seen = []
    for key in fair.in_order():
        seen.append(key)
        if key % 2 == 0:
            fair.take(key + 1)  # taken before the walk reaches it
    assert seen == [0, 2, 4, 6, 8] and list(fair.in_order()) == [0, 2, 4, 6, 8]


def test_priority_queue_walks_classes_in_order_skips_expired_and_takes_any_entry() -> None:
    clock = FakeClock(start_s=0.0)
    queue: PriorityQueue[str] = PriorityQueue(clock)
    batch = queue.push("b1", "batch").entry
    interactive = [queue.push(f"i{n}", "interactive").entry for n in range(3)]
    critical = queue.push("c1", "critical").entry
    assert batch is not None and critical is not None and all(interactive)
    assert [e.item for e in queue.in_dispatch_order()] == ["c1", "i0", "i1", "i2", "b1"]
    middle = interactive[1]
    assert middle is not None and queue.take(middle) and not queue.take(middle)
    assert len(queue) == 4 and queue.depth("interactive") == 2
    clock.advance(15.0)  # interactive (10 s) expired, critical (30 s) and batch (300 s) not
    assert [e.item for e in queue.in_dispatch_order()] == ["c1", "b1"]
    assert [e.item for e in queue.expire()] == ["i0", "i2"]
    assert queue.pop_next() is critical and queue.pop_next() is batch and queue.pop_next() is None
