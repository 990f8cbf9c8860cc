"""The retry lane in the controller: a queue refusal's Retry-After is a booking, and the retry that comes
back then goes ahead of the fresh arrivals of its class — through early refusal, through the queue —
while one that comes early is a fresh arrival; the classes above still come first."""

import asyncio

from admission.outcomes import AdmissionRefused, HoldOutcome, RejectReason
from admission.priority_classes import PriorityClass
from admission.ticket import Ticket

from .fakes import Harness, Slot, make_harness, req, settle


class LaneOutcomes:
    """An observer that keeps the retry lane's reports, in order."""

    def __init__(self) -> None:
        self.lane: list[str] = []

    def queue_depth_changed(self, priority: str, depth: int) -> None: ...

    def dispatched(self, priority: str, queue_wait_s: float) -> None: ...

    def rejected(self, reason: RejectReason, priority: str) -> None: ...

    def held(self, outcome: HoldOutcome, held_s: float) -> None: ...

    def retry_lane(self, outcome: str, priority: str) -> None:
        self.lane.append(outcome)


CLASSES = (
    PriorityClass("critical", 30.0),
    PriorityClass("interactive", 4.0),
    PriorityClass("batch", 300.0),
)


async def _full_pool(h: Harness, rounds: int = 20, hold_s: float = 1.0) -> list[Ticket[Slot]]:
    """20 slots, every one released and taken again each `hold_s`: C = 20 / hold_s, the pool full now
    with one cohort."""
    held: list[Ticket[Slot]] = []
    for _ in range(rounds):
        h.clock.advance(hold_s)
        for ticket in held:
            await ticket.release()
        held = [await h.controller.admit(req(f"steady{n}")) for n in range(20)]
    return held


async def _queue(
    h: Harness, labels: list[str], priority: str = "interactive"
) -> list[asyncio.Task[Ticket[Slot]]]:
    tasks = [asyncio.create_task(h.controller.admit(req(label, priority))) for label in labels]
    await settle()
    assert not any(task.done() for task in tasks)
    return tasks


async def _refused(h: Harness, label: str) -> AdmissionRefused:
    try:
        await asyncio.wait_for(h.controller.admit(req(label)), timeout=1)
    except AdmissionRefused as refusal:
        return refusal
    raise AssertionError(f"{label} was admitted")


async def _release_all(h: Harness, held: list[Ticket[Slot]], tasks: list[asyncio.Task[Ticket[Slot]]]) -> None:
    for task in tasks:
        task.cancel()
    await settle()
    for ticket in held:
        await ticket.release()
    assert h.fleet.in_use == 0 and h.controller.held_tickets() == 0 and len(h.controller) == 0


async def test_a_refused_retry_that_comes_back_when_told_is_queued_and_dispatched_first() -> None:
    h = make_harness(slots=20, classes=CLASSES, early_refusal_ratio=0.25, retry_lane_share=0.5)
    held = await _full_pool(h)
    fresh = await _queue(h, [f"w{n}" for n in range(20)])  # as many as fit in B = 1 s
    refusal = await _refused(h, "late")
    assert refusal.reason is RejectReason.QUEUE_FULL
    assert refusal.retry_after_s == 1, "the lane's first place: 1 s, not the queue's 2 s estimate"
    assert "a retry in 1 s goes ahead of new arrivals" in refusal.message
    assert (await _refused(h, "fresh-twin")).reason is RejectReason.QUEUE_FULL, "others are still refused"

    h.clock.advance(1.0)
    back = asyncio.create_task(h.controller.admit(req("late")))
    await settle()
    assert not back.done(), "queued at its class's head, not refused"
    await held[0].release()
    await settle()
    assert back.done() and h.fleet.dispatched[-1] == "late", "dispatched before the 20 fresh waiters"
    assert h.controller.retry_lane.stats.claimed == 1
    await _release_all(h, [*held[1:], back.result()], fresh)


async def test_a_retry_that_comes_early_is_a_fresh_arrival_and_keeps_its_place() -> None:
    h = make_harness(slots=20, classes=CLASSES, early_refusal_ratio=0.25, retry_lane_share=0.5)
    held = await _full_pool(h)
    fresh = await _queue(h, [f"w{n}" for n in range(20)])
    assert (await _refused(h, "eager")).retry_after_s == 1
    h.clock.advance(0.2)
    assert (await _refused(h, "eager")).reason is RejectReason.QUEUE_FULL, "too early: refused as new"
    assert h.controller.retry_lane.stats.claimed == 0
    await _release_all(h, held, fresh)


async def test_returning_retries_queue_behind_the_classes_above() -> None:
    h = make_harness(slots=20, classes=CLASSES, early_refusal_ratio=0.25, retry_lane_share=0.5)
    held = await _full_pool(h)
    fresh = await _queue(h, [f"w{n}" for n in range(20)])
    await _refused(h, "late")
    h.clock.advance(1.0)
    critical = await _queue(h, ["c0"], "critical")
    back = asyncio.create_task(h.controller.admit(req("late")))
    await settle()
    await held[0].release()
    await held[1].release()
    await settle()
    assert h.fleet.dispatched[-2:] == ["c0", "late"]
    await _release_all(h, [*held[2:], critical[0].result(), back.result()], fresh)


async def test_with_the_lane_off_a_refusal_keeps_the_queue_estimate_and_a_retry_is_new() -> None:
    h = make_harness(slots=20, classes=CLASSES, early_refusal_ratio=0.25)
    held = await _full_pool(h)
    fresh = await _queue(h, [f"w{n}" for n in range(20)])
    assert (await _refused(h, "late")).retry_after_s == 2
    h.clock.advance(1.0)
    assert (await _refused(h, "late")).reason is RejectReason.QUEUE_FULL
    assert len(h.controller.retry_lane) == 0
    await _release_all(h, held, fresh)


async def test_no_place_inside_the_hold_of_the_cohort_running_now() -> None:
    """A cohort of 20 holds every slot for 3 s: a refusal just after it started gets no place (the
    slots free in 3 s, past the 2 s horizon) and the queue's Retry-After; 1.5 s later a refusal gets
    the place at the cohort's end."""
    h = make_harness(slots=20, classes=CLASSES, early_refusal_ratio=0.25, retry_lane_share=1.0)
    held = await _full_pool(h, hold_s=3.0)  # nothing frees within B = 1 s: every arrival is refused
    early = await _refused(h, "early")
    assert "goes ahead" not in early.message and len(h.controller.retry_lane) == 0
    h.clock.advance(1.5)
    later = await _refused(h, "later")
    assert later.retry_after_s == 2 and "a retry in 2 s goes ahead" in later.message
    await _release_all(h, held, [])


async def test_a_returning_retry_refused_all_the_same_is_reported_broken() -> None:
    """The place was booked for a release the forecast expected; nothing freed, and the returning
    request ran out its class's 4 s at the head of the queue."""
    seen = LaneOutcomes()
    h = make_harness(slots=20, classes=CLASSES, early_refusal_ratio=0.25, retry_lane_share=1.0, observer=seen)
    held = await _full_pool(h)
    fresh = await _queue(h, [f"w{n}" for n in range(20)])
    await _refused(h, "late")
    h.clock.advance(1.0)
    back = asyncio.create_task(h.controller.admit(req("late")))
    await settle()
    assert not back.done(), "queued at the head"
    h.timers.advance(4.0)  # no slot frees: every waiter's deadline passes
    await settle()
    assert isinstance(back.exception(), AdmissionRefused)
    assert all(isinstance(task.exception(), AdmissionRefused) for task in fresh), "queue_timeout"
    assert seen.lane[:2] == ["promised", "claimed"]
    assert seen.lane.count("broken") == 1, "the returning one; the fresh waiters' timeouts are promised"
    await _release_all(h, held, [])
