"""queue_full (full queue, displacement), queue_timeout (timer and before dispatch; the headroom at the
deadline), cancellation, draining — each with a computed Retry-After."""

import asyncio
import math

import pytest

from admission.outcomes import AdmissionRefused, RejectReason
from admission.priority_classes import PriorityClass
from admission.retry_after import queue_retry_after_s
from admission.ticket import AdmissionRequest, Ticket

from .fakes import Harness, Slot, make_harness, req, run_scheduled_pump, settle


def refusal_of(task: asyncio.Task[object]) -> AdmissionRefused:
    assert task.done(), "the waiter should have been answered"
    exc = task.exception()
    assert isinstance(exc, AdmissionRefused)
    return exc


async def test_full_queue_displaces_the_youngest_lowest_priority_waiter() -> None:
    h = make_harness(slots=1, max_depth=3)
    first = await h.controller.admit(req("running"))
    old_batch = asyncio.create_task(h.controller.admit(req("b-old", "batch")))
    await settle()
    h.clock.advance(1.0)
    young_batch = asyncio.create_task(h.controller.admit(req("b-young", "batch")))
    interactive = asyncio.create_task(h.controller.admit(req("i", "interactive")))
    await settle()
    critical = asyncio.create_task(h.controller.admit(req("c", "critical")))
    await settle()
    refused = refusal_of(young_batch)
    assert refused.reason is RejectReason.QUEUE_FULL and refused.priority == "batch"
    assert refused.retry_after_s >= 1
    assert not old_batch.done() and not interactive.done() and not critical.done()
    assert h.controller.depths() == {"critical": 1, "interactive": 1, "batch": 1}
    assert h.controller.stats.rejected[RejectReason.QUEUE_FULL] == 1
    await first.release()
    await settle()
    assert critical.done() and "b-young" not in h.fleet.asked
    for task in (critical, interactive, old_batch):
        await settle()
        await task.result().release()


async def test_full_queue_refuses_equal_priority_with_retry_after_from_rate_and_queue() -> None:
    h = make_harness(slots=1, max_depth=2)
    first = await h.controller.admit(req("running", "critical"))  # one dispatch measured at t0
    waiters = [asyncio.create_task(h.controller.admit(req(f"c{n}", "critical"))) for n in range(2)]
    await settle()
    h.clock.advance(3.0)
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("c-late", "critical"))
    rate = h.controller.dispatch_rate_per_s()
    assert rate is not None and rate > 0
    expected = queue_retry_after_s(2, rate, drain_bound_s=30.0 - 3.0)
    assert refused.value.reason is RejectReason.QUEUE_FULL
    assert refused.value.retry_after_s == expected == math.ceil(2 / rate)
    assert "c-late" not in h.fleet.asked  # critical waiters ahead: no fast-path probe either
    assert len(h.controller) == 2
    await first.release()
    for task in waiters:
        await settle()
        await task.result().release()


async def test_expiry_timer_answers_queue_timeout_without_dispatching() -> None:
    h = make_harness(slots=1)
    first = await h.controller.admit(req("running"))
    waiter = asyncio.create_task(h.controller.admit(req("slow", "interactive")))
    await settle()
    assert h.timers.next_when_s() == h.clock.now_s() + 10.0
    h.timers.advance(9.999)
    await settle()
    assert not waiter.done()
    h.timers.advance(0.001)  # deadline reached: expired (now ≥ deadline)
    await settle()
    refused = refusal_of(waiter)
    assert refused.reason is RejectReason.QUEUE_TIMEOUT and refused.retry_after_s >= 1
    assert len(h.controller) == 0 and h.timers.pending == 0
    await first.release()
    assert h.fleet.asked.count("slow") == 1  # only its fast-path probe, never after queueing
    assert h.fleet.in_use == 0


async def test_at_its_deadline_a_waiter_takes_a_slot_in_the_headroom_instead_of_queue_timeout() -> None:
    h = make_harness(slots=1, headroom=1)
    first = await h.controller.admit(req("running"))
    waiter = asyncio.create_task(h.controller.admit(req("late", "interactive")))
    await settle()
    h.timers.advance(9.999)
    await settle()
    assert not waiter.done() and "deadline:late" not in h.fleet.asked, "the headroom is for the deadline only"
    h.timers.advance(0.001)
    await settle()
    grant = waiter.result()
    assert grant.slot().label == "late" and grant.queue_wait_s == pytest.approx(10.0)
    assert h.controller.stats.dispatched["interactive"] == 2
    assert not h.controller.stats.rejected and len(h.controller) == 0 and h.timers.pending == 0
    await grant.release()
    await first.release()
    assert h.fleet.in_use == 0


async def test_without_headroom_left_the_deadline_still_answers_queue_timeout() -> None:
    h = make_harness(slots=1, headroom=1)
    first = await h.controller.admit(req("running"))
    extra = h.fleet.try_at_deadline(req("other"))  # somebody else holds the headroom
    assert extra is not None
    waiter = asyncio.create_task(h.controller.admit(req("late", "interactive")))
    await settle()
    h.timers.advance(10.0)
    await settle()
    assert refusal_of(waiter).reason is RejectReason.QUEUE_TIMEOUT
    assert h.fleet.asked.count("deadline:late") == 1
    extra.release()
    await first.release()
    assert h.fleet.in_use == 0


async def test_a_refusal_raised_at_the_deadline_is_the_waiters_answer() -> None:
    h = make_harness(slots=1, headroom=1)
    first = await h.controller.admit(req("running"))

    def no_replica(request: AdmissionRequest) -> Slot | None:
        raise AdmissionRefused(RejectReason.NO_REPLICA, 5, "every replica is down")

    h.controller._queue_pump._try_at_deadline = no_replica  # the seam the gateway's hook fills
    waiter = asyncio.create_task(h.controller.admit(req("late", "interactive")))
    await settle()
    h.timers.advance(10.0)
    await settle()
    assert refusal_of(waiter).reason is RejectReason.NO_REPLICA
    await first.release()


async def test_a_waiter_past_its_deadline_gets_queue_timeout_before_it_could_be_dispatched() -> None:
    h = make_harness(slots=1)
    first = await h.controller.admit(req("running"))
    late = asyncio.create_task(h.controller.admit(req("late", "interactive")))
    await settle()
    h.clock.advance(10.0)  # the timer has not fired yet (e.g. the loop was busy) ...
    await first.release()  # ... and a slot frees: expiry is checked first
    await settle()
    assert refusal_of(late).reason is RejectReason.QUEUE_TIMEOUT
    assert h.fleet.dispatched == ["running"] and h.fleet.in_use == 0


async def _dispatch_one_per_second(h: Harness, priorities: list[str]) -> Ticket[Slot]:
    """Dispatch one request per second through the fast path, of the given classes in turn; return
    the grant still holding the fleet's single slot."""
    grant = await h.controller.admit(req("g0", priorities[0]))
    for n, priority in enumerate(priorities[1:], start=1):
        h.clock.advance(1.0)
        await grant.release()
        grant = await h.controller.admit(req(f"g{n}", priority))
    return grant


async def _time_out_behind_three_critical(
    h: Harness,
) -> tuple[AdmissionRefused, list[asyncio.Task[Ticket[Slot]]]]:
    """Queue 3 critical waiters and one interactive, let the interactive one's 2 s pass: its refusal,
    and the critical waiters (still queued)."""
    waiters = [asyncio.create_task(h.controller.admit(req(f"c{n}", "critical"))) for n in range(3)]
    doomed = asyncio.create_task(h.controller.admit(req("i", "interactive")))
    await settle()
    h.timers.advance(2.0)
    await settle()
    return refusal_of(doomed), waiters


async def test_expiry_retry_after_uses_the_rate_left_to_the_class() -> None:
    """Slots turn over once a second (C = 1 grant ÷ 1 s) and nothing above interactive is dispatched,
    but three critical requests arrived: their demand (arrivals, not dispatches) is what the classes
    above take, so interactive's Retry-After is 3 waiters ahead ÷ (C − their arrival rate) — longer
    than 3 ÷ C."""
    classes = (PriorityClass("critical", 30.0), PriorityClass("interactive", 2.0))
    h = make_harness(slots=1, classes=classes)
    grant = await _dispatch_one_per_second(h, ["interactive"] * 5)
    refused, waiters = await _time_out_behind_three_critical(h)
    assert refused.reason is RejectReason.QUEUE_TIMEOUT
    assert h.controller.above_rate_per_s("interactive") > 0.0, "the critical arrivals count as demand"
    left = h.controller.available_rate_per_s("interactive")
    assert left is not None and 0.0 < left < 1.0
    assert refused.retry_after_s == queue_retry_after_s(3, left, drain_bound_s=28.0)
    assert refused.retry_after_s > 3
    for task in waiters:
        task.cancel()
    await grant.release()


async def test_retry_after_of_a_class_the_higher_classes_starve_is_long() -> None:
    """Every dispatch so far went to critical, at about the pool's whole capacity: little is left to
    interactive, so its Retry-After is ahead ÷ that remainder (or the time by which the critical
    waiters ahead have left the queue), far more than ahead ÷ the total rate."""
    classes = (PriorityClass("critical", 30.0), PriorityClass("interactive", 2.0))
    h = make_harness(slots=1, classes=classes)
    grant = await _dispatch_one_per_second(h, ["critical"] * 5)
    assert h.controller.available_rate_per_s("interactive") == 0.0
    total = h.controller.dispatch_rate_per_s()
    assert total is not None and math.ceil(3 / total) < 28
    refused, waiters = await _time_out_behind_three_critical(h)
    left = h.controller.available_rate_per_s("interactive")
    retry_after_s = refused.retry_after_s
    assert retry_after_s == queue_retry_after_s(3, left, drain_bound_s=28.0)
    assert retry_after_s > 2 * math.ceil(3 / total)
    for task in waiters:
        task.cancel()
    await grant.release()


async def test_cancelled_waiter_leaves_at_once_and_is_never_dispatched() -> None:
    h = make_harness(slots=1)
    first = await h.controller.admit(req("running"))
    gone = asyncio.create_task(h.controller.admit(req("gone")))
    stays = asyncio.create_task(h.controller.admit(req("stays")))
    await settle()
    gone.cancel()
    await settle()
    assert gone.cancelled()
    assert len(h.controller) == 1 and h.controller.stats.cancelled["interactive"] == 1
    await first.release()
    await settle()
    assert stays.done() and h.fleet.asked.count("gone") == 1  # only its fast-path probe
    await stays.result().release()
    assert h.fleet.in_use == 0


async def test_cancel_before_its_handler_runs_still_skips_the_waiter() -> None:
    h = make_harness(slots=1)
    first = await h.controller.admit(req("running"))
    gone = asyncio.create_task(h.controller.admit(req("gone")))
    stays = asyncio.create_task(h.controller.admit(req("stays")))
    await settle()
    gone.cancel()  # its future is cancelled now; its CancelledError handler runs later
    first.slot().release()  # → on_release in the same instant
    await settle()
    assert gone.cancelled() and stays.done() and h.fleet.asked.count("gone") == 1
    await first.release()
    await stays.result().release()
    assert h.fleet.in_use == 0 and len(h.controller) == 0


async def test_cancel_landing_right_after_dispatch_gives_the_slot_back() -> None:
    h = make_harness(slots=1)
    first = await h.controller.admit(req("running"))
    racer = asyncio.create_task(h.controller.admit(req("racer")))
    await settle()
    first.slot().release()
    await run_scheduled_pump()  # racer's future gets the slot ...
    assert h.fleet.in_use == 1
    racer.cancel()  # ... but its task is cancelled before it resumes
    await settle()
    assert racer.cancelled()
    assert h.fleet.in_use == 0 and h.controller.stats.cancelled["interactive"] == 1
    await first.release()


async def test_reject_waiting_answers_every_waiter_with_the_given_reason() -> None:
    h = make_harness(slots=1)
    first = await h.controller.admit(req("running"))
    tasks = [
        asyncio.create_task(h.controller.admit(req(f"w{n}", p))) for n, p in enumerate(["batch", "critical"])
    ]
    await settle()
    assert h.controller.reject_waiting(RejectReason.DRAINING, 5, "shutting down") == 2
    await settle()
    assert [refusal_of(t).reason for t in tasks] == [RejectReason.DRAINING] * 2
    assert h.controller.stats.rejected[RejectReason.DRAINING] == 2 and h.timers.pending == 0
    await first.release()


async def test_default_loop_timer_expires_waiters_in_real_time() -> None:
    from admission.config import AdmissionConfig
    from admission.controller import AdmissionController
    from admission.tenant_gate import TenantGate
    from core.clock import SystemClock

    from .fakes import FakeFleet

    clock = SystemClock()
    fleet = FakeFleet(slots=1)
    config = AdmissionConfig(classes=(PriorityClass("interactive", max_wait_s=0.05),))
    controller = AdmissionController(
        fleet.try_dispatch, TenantGate.in_memory(clock), clock=clock, config=config
    )
    fleet.controller = controller
    first = await controller.admit(req("running"))
    started_s = clock.now_s()
    with pytest.raises(AdmissionRefused) as refused:
        await asyncio.wait_for(controller.admit(req("waits")), timeout=2.0)
    assert refused.value.reason is RejectReason.QUEUE_TIMEOUT
    assert 0.04 <= clock.now_s() - started_s < 1.0
    await first.release()
    assert fleet.dispatched == ["running"]


async def test_the_classes_above_count_by_their_arrivals_refused_ones_included() -> None:
    """λ_above is the higher classes' demand: critical arrivals refused at arrival (their class's queue
    is full) still count for interactive, so past the knee a lower class yields the slots the
    refused higher-class arrivals needed instead of taking them."""
    classes = (PriorityClass("critical", 30.0, max_depth=1), PriorityClass("interactive", 10.0))
    h = make_harness(slots=1, classes=classes)
    grant = await h.controller.admit(req("running", "interactive"))
    queued = asyncio.create_task(h.controller.admit(req("c0", "critical")))
    await settle()
    for n in range(1, 6):
        with pytest.raises(AdmissionRefused):
            await h.controller.admit(req(f"c{n}", "critical"))
    six_in_the_first_second = 6 / (10.0 * -math.expm1(-1.0 / 10.0))  # the meter's 1 s floor, τ = 10 s
    assert h.controller.above_rate_per_s("interactive") == pytest.approx(six_in_the_first_second)
    assert h.controller.above_rate_per_s("critical") == 0.0
    queued.cancel()
    await grant.release()
