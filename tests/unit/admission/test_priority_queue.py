from collections.abc import Sequence
from typing import Any

import pytest

from admission.outcomes import RejectReason
from admission.priority_classes import DEFAULT_PRIORITY_CLASSES, PriorityClass
from admission.priority_queue import PriorityQueue
from admission.queue_entry import QueueEntry
from core.clock import FakeClock

CLASSES = (
    PriorityClass("critical", max_wait_s=30.0),
    PriorityClass("interactive", max_wait_s=10.0),
    PriorityClass("batch", max_wait_s=300.0),
)


def make_queue(
    clock: FakeClock, max_depth: int = 100, classes: Sequence[PriorityClass] = CLASSES
) -> PriorityQueue[str]:
    return PriorityQueue(clock, classes=classes, max_depth=max_depth)


def push(queue: PriorityQueue[str], item: str, priority: str, **kwargs: Any) -> QueueEntry[str]:
    result = queue.push(item, priority, **kwargs)
    assert result.entry is not None
    return result.entry


def drain(queue: PriorityQueue[str]) -> list[str]:
    items = []
    while (entry := queue.pop_next()) is not None:
        items.append(entry.item)
    return items


def test_defaults_match_the_design() -> None:
    queue: PriorityQueue[str] = PriorityQueue(FakeClock())
    assert queue.class_names == ("critical", "interactive", "batch")
    assert queue.max_depth == 2000
    assert [c.max_wait_s for c in DEFAULT_PRIORITY_CLASSES] == [30.0, 10.0, 300.0]
    assert queue.priority_class("batch").max_wait_s == 300.0


def test_fifo_within_a_class_and_priority_across_classes() -> None:
    queue = make_queue(FakeClock())
    for item, priority in [("b1", "batch"), ("i1", "interactive"), ("b2", "batch"), ("c1", "critical")]:
        push(queue, item, priority)
    push(queue, "i2", "interactive")
    assert drain(queue) == ["c1", "i1", "i2", "b1", "b2"]
    assert len(queue) == 0


def test_full_queue_displaces_youngest_waiter_of_lowest_lower_class() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_depth=4)
    push(queue, "i1", "interactive")
    push(queue, "b1", "batch")
    clock.advance(1)
    push(queue, "b2", "batch")
    push(queue, "i2", "interactive")
    result = queue.push("c1", "critical")
    assert result.accepted and result.reason is None
    assert result.displaced is not None and result.displaced.item == "b2"
    assert len(queue) == 4
    assert drain(queue) == ["c1", "i1", "i2", "b1"]


def test_displacement_skips_empty_lower_classes() -> None:
    queue = make_queue(FakeClock(), max_depth=2)
    push(queue, "i1", "interactive")
    push(queue, "i2", "interactive")
    result = queue.push("c1", "critical")
    assert result.displaced is not None and result.displaced.item == "i2"


def test_interactive_displaces_batch_but_not_critical() -> None:
    queue = make_queue(FakeClock(), max_depth=2)
    push(queue, "c1", "critical")
    push(queue, "b1", "batch")
    result = queue.push("i1", "interactive")
    assert result.displaced is not None and result.displaced.item == "b1"
    refused = queue.push("i2", "interactive")
    assert not refused.accepted and refused.reason is RejectReason.QUEUE_FULL and refused.displaced is None


@pytest.mark.parametrize("priority", ["batch", "interactive"])
def test_equal_or_lower_priority_is_refused_when_full(priority: str) -> None:
    queue = make_queue(FakeClock(), max_depth=2)
    push(queue, "i1", "interactive")
    push(queue, "i2", "interactive")
    result = queue.push("x", priority)
    assert result.entry is None
    assert result.displaced is None
    assert result.reason is RejectReason.QUEUE_FULL
    assert queue.depths() == {"critical": 0, "interactive": 2, "batch": 0}


def test_per_class_depth_refuses_even_with_global_room() -> None:
    classes = (PriorityClass("critical", 30.0, max_depth=1), PriorityClass("batch", 300.0, max_depth=0))
    queue = make_queue(FakeClock(), max_depth=10, classes=classes)
    push(queue, "c1", "critical")
    assert queue.push("c2", "critical").reason is RejectReason.QUEUE_FULL
    assert queue.push("b1", "batch").reason is RejectReason.QUEUE_FULL
    assert len(queue) == 1


def test_removed_waiter_is_never_dispatched() -> None:
    queue = make_queue(FakeClock())
    first = push(queue, "a", "interactive")
    push(queue, "b", "interactive")
    assert queue.remove(first)
    assert not queue.remove(first)
    assert queue.depth("interactive") == 1
    assert drain(queue) == ["b"]


def test_remove_after_dispatch_or_displacement_is_false() -> None:
    queue = make_queue(FakeClock(), max_depth=1)
    batch = push(queue, "b", "batch")
    critical = queue.push("c", "critical").entry
    assert critical is not None
    assert not queue.remove(batch)
    assert queue.pop_next() is critical
    assert not queue.remove(critical)


def test_expire_returns_entries_past_their_class_age() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    push(queue, "i1", "interactive")  # deadline 10
    clock.advance(5)
    push(queue, "i2", "interactive")  # deadline 15
    push(queue, "c1", "critical")  # deadline 35
    push(queue, "b1", "batch")  # deadline 305
    assert queue.next_expiry_s() == 10.0
    assert queue.expire() == []
    clock.set(10.0)  # exactly at the deadline: expired
    assert [e.item for e in queue.expire()] == ["i1"]
    assert queue.next_expiry_s() == 15.0
    expired = queue.expire(now_s=40.0)
    assert [e.item for e in expired] == ["c1", "i2"]
    assert expired[0].waited_s(40.0) == 35.0
    assert len(queue) == 1
    assert queue.next_expiry_s() == 305.0


def test_next_expiry_is_none_when_empty() -> None:
    assert make_queue(FakeClock()).next_expiry_s() is None


def test_pop_next_never_dispatches_an_expired_entry() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    push(queue, "i1", "interactive")
    clock.advance(6)
    push(queue, "i2", "interactive")
    clock.advance(4)  # i1 expired (t=10), i2 not (deadline 16)
    popped = queue.pop_next()
    assert popped is not None and popped.item == "i2"
    assert len(queue) == 1  # i1 waits for expire()
    clock.advance(10)
    push(queue, "b1", "batch")
    popped = queue.pop_next()
    assert popped is not None and popped.item == "b1"


def test_expired_entry_skipped_by_pop_is_still_answered_by_expire() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    push(queue, "i1", "interactive")
    clock.advance(11)
    assert queue.pop_next() is None
    assert len(queue) == 1
    assert [e.item for e in queue.expire()] == ["i1"]
    assert len(queue) == 0


def test_remove_of_expired_entry_skipped_by_pop() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    entry = push(queue, "i1", "interactive")
    clock.advance(11)
    assert queue.pop_next() is None
    assert queue.remove(entry)
    assert queue.expire() == []


def test_fair_share_between_heavy_and_light_tenant_within_a_class() -> None:
    queue = make_queue(FakeClock())
    for n in range(20):
        push(queue, f"heavy{n}", "batch", tenant="heavy", estimated_tokens=8000)
    for n in range(3):
        push(queue, f"light{n}", "batch", tenant="light", estimated_tokens=200)
    order = drain(queue)
    assert order[:4] == ["light0", "light1", "light2", "heavy0"]


def test_ahead_of_and_drain_bound() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    push(queue, "c1", "critical")  # deadline 30
    push(queue, "i1", "interactive")  # deadline 10
    push(queue, "b1", "batch")  # deadline 300
    assert queue.ahead_of("critical") == 1
    assert queue.ahead_of("interactive") == 2
    assert queue.ahead_of("batch") == 3
    clock.advance(5)
    assert queue.drain_bound_s("interactive") == 25.0
    assert queue.drain_bound_s("batch") == 295.0
    assert make_queue(clock).drain_bound_s("batch") == 0.0


def test_unknown_class_raises() -> None:
    queue = make_queue(FakeClock())
    with pytest.raises(ValueError, match="unknown priority class"):
        queue.push("x", "urgent")


@pytest.mark.parametrize(
    ("classes", "max_depth"),
    [
        ((), 10),
        ((PriorityClass("a", 1.0), PriorityClass("a", 2.0)), 10),
        ((PriorityClass("a", 1.0),), 0),
        ((PriorityClass("a", 0.0),), 10),
        ((PriorityClass("a", 1.0, max_depth=-1),), 10),
    ],
)
def test_invalid_configuration_raises(classes: Sequence[PriorityClass], max_depth: int) -> None:
    with pytest.raises(ValueError):
        PriorityQueue(FakeClock(), classes=classes, max_depth=max_depth)


def test_custom_class_list() -> None:
    classes = (PriorityClass("gold", 5.0), PriorityClass("free", 60.0, max_depth=3))
    queue = make_queue(FakeClock(), classes=classes)
    push(queue, "f", "free")
    push(queue, "g", "gold")
    assert drain(queue) == ["g", "f"]


@pytest.mark.parametrize(("tokens", "weight"), [(-1, 1.0), (10, 0.0)])
def test_invalid_push_raises_before_displacing(tokens: int, weight: float) -> None:
    queue = make_queue(FakeClock(), max_depth=1)
    push(queue, "b", "batch")
    with pytest.raises(ValueError):
        queue.push("c", "critical", estimated_tokens=tokens, weight=weight)
    assert queue.depths()["batch"] == 1
