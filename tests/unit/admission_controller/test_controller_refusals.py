"""queue_full (full queue, displacement), queue_timeout (timer and before dispatch), cancellation,
draining — each with a computed Retry-After."""

import asyncio
import math

import pytest

from admission.grant import Grant
from admission.outcomes import AdmissionRefused, RejectReason
from admission.priority_queue import PriorityClass
from admission.retry_after import queue_retry_after_s

from .fakes import Harness, Slot, make_harness, req, settle


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


async def _dispatch_one_per_second(h: Harness, priorities: list[str]) -> Grant[Slot]:
    """Dispatch one request per second through the fast path, of the given classes in turn; return
    the grant still holding the fleet's single slot."""
    grant = await h.controller.admit(req("g0", priorities[0]))
    for n, priority in enumerate(priorities[1:], start=1):
        h.clock.advance(1.0)
        await grant.release()
        grant = await h.controller.admit(req(f"g{n}", priority))
    return grant


async def test_expiry_retry_after_uses_the_measured_dispatch_rate() -> None:
    classes = (PriorityClass("critical", 30.0), PriorityClass("interactive", 2.0))
    h = make_harness(slots=1, classes=classes)
    grant = await _dispatch_one_per_second(h, ["interactive"] * 5)  # rate ≈ 1/s
    waiters = [asyncio.create_task(h.controller.admit(req(f"c{n}", "critical"))) for n in range(3)]
    doomed = asyncio.create_task(h.controller.admit(req("i", "interactive")))
    await settle()
    h.timers.advance(2.0)
    await settle()
    refused = refusal_of(doomed)
    rate = h.controller.dispatch_rate_per_s()
    assert rate is not None
    assert refused.retry_after_s == queue_retry_after_s(3, rate, drain_bound_s=28.0)  # 3 critical ahead
    assert refused.retry_after_s == math.ceil(3 / rate) > 1
    for task in waiters:
        task.cancel()
    await grant.release()


async def test_retry_after_of_a_class_the_higher_classes_starve_is_the_drain_bound() -> None:
    """Every dispatch so far went to critical: interactive is served at 0/s, so its Retry-After is the
    time by which the critical waiters ahead have left the queue, not ahead ÷ the total rate."""
    classes = (PriorityClass("critical", 30.0), PriorityClass("interactive", 2.0))
    h = make_harness(slots=1, classes=classes)
    grant = await _dispatch_one_per_second(h, ["critical"] * 5)
    waiters = [asyncio.create_task(h.controller.admit(req(f"c{n}", "critical"))) for n in range(3)]
    doomed = asyncio.create_task(h.controller.admit(req("i", "interactive")))
    await settle()
    assert h.controller.serving_rate_per_s("interactive") == 0.0
    total = h.controller.dispatch_rate_per_s()
    assert total is not None and math.ceil(3 / total) < 28
    h.timers.advance(2.0)
    await settle()
    assert refusal_of(doomed).retry_after_s == queue_retry_after_s(3, 0.0, drain_bound_s=28.0) == 28
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
    first.token.release()  # → on_release in the same instant
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
    first.token.release()  # racer's future gets the slot ...
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
    from admission.clock import SystemClock
    from admission.controller import AdmissionConfig, AdmissionController
    from admission.tenant_gate import TenantGate

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


async def test_early_refusal_when_the_expected_wait_exceeds_the_class_limit() -> None:
    from admission.controller import AdmissionConfig, AdmissionController

    h = make_harness(slots=1)
    config = AdmissionConfig(early_refusal_ratio=1.0)
    controller = AdmissionController(
        h.fleet.try_dispatch, h.gate, clock=h.clock, config=config, timers=h.timers
    )
    h.fleet.controller = controller
    first = await controller.admit(req("running"))
    assert controller.dispatch_rate_per_s() is not None
    queued = [asyncio.create_task(controller.admit(req(f"i{n}"))) for n in range(3)]
    await settle()
    h.clock.advance(5.0)  # one dispatch in 5 s: about 0.2 per second measured
    rate = controller.dispatch_rate_per_s()
    assert rate is not None and (3 + 1) / rate > 10.0, "four ahead at this rate cannot make the 10 s limit"
    with pytest.raises(AdmissionRefused) as refused:
        await controller.admit(req("hopeless"))
    assert refused.value.reason is RejectReason.QUEUE_FULL and "over its 10 s limit" in str(refused.value)
    assert refused.value.retry_after_s >= 1
    assert "hopeless" not in h.fleet.asked
    critical = asyncio.create_task(controller.admit(req("c", "critical")))
    await settle()
    assert not critical.done(), "nothing is ahead of a critical arrival: it queues"
    await first.release()
    for task in (critical, *queued):
        await settle()
        await (await task).release()


async def test_early_refusal_counts_the_higher_classes_that_will_overtake() -> None:
    """Half the dispatches go to critical: an interactive arrival behind 2 critical waiters needs 3
    dispatches of the ~0.6/s left to its class (≈ 5 s > 4 s), though at the total ~1.2/s it would seem
    to make it (≈ 2.5 s): it is refused at arrival, not after 4 s of waiting."""
    classes = (PriorityClass("critical", 30.0), PriorityClass("interactive", 4.0))
    h = make_harness(slots=1, classes=classes, early_refusal_ratio=1.0)
    grant = await _dispatch_one_per_second(h, ["critical", "interactive"] * 4)
    total, serving = h.controller.dispatch_rate_per_s(), h.controller.serving_rate_per_s("interactive")
    assert total is not None and serving is not None
    assert 3 / total <= 4.0 < 3 / serving
    waiters = [asyncio.create_task(h.controller.admit(req(f"c{n}", "critical"))) for n in range(2)]
    await settle()
    assert not any(task.done() for task in waiters), "critical has nothing above it: it queues"
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("overtaken"))
    assert refused.value.reason is RejectReason.QUEUE_FULL
    assert "over its 4 s limit" in str(refused.value)
    assert refused.value.retry_after_s == queue_retry_after_s(2, serving, drain_bound_s=30.0) == 4
    for task in waiters:
        task.cancel()
    await grant.release()


async def test_early_refusal_keeps_a_margin_for_a_burst_of_higher_class_arrivals() -> None:
    """Nobody waits and the class gets ~0.6 of ~1.2 dispatches/s: one dispatch is expected within
    1.7 s of its 4 s, but ~2.4 critical arrivals are expected meanwhile, and planning for a burst of
    them (+2 √2.4 ≈ 3.1) leaves it no room: refused, with the burst named."""
    classes = (PriorityClass("critical", 30.0), PriorityClass("interactive", 4.0))
    h = make_harness(slots=1, classes=classes, early_refusal_ratio=1.0)
    grant = await _dispatch_one_per_second(h, ["critical", "interactive"] * 4)
    serving = h.controller.serving_rate_per_s("interactive")
    assert serving is not None and 1 / serving < 4.0
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("unlucky"))
    assert "with a burst of higher-class arrivals" in str(refused.value)
    await grant.release()


async def test_a_class_starved_by_the_classes_above_is_refused_at_arrival() -> None:
    h = make_harness(slots=1, early_refusal_ratio=1.0)
    grant = await _dispatch_one_per_second(h, ["interactive"] * 5)
    assert h.controller.serving_rate_per_s("batch") == 0.0
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("b", "batch"))
    assert "indefinitely" in str(refused.value) and refused.value.retry_after_s >= 1
    assert "b" not in h.fleet.dispatched
    await grant.release()
    late = await h.controller.admit(req("b-late", "batch"))
    assert h.fleet.dispatched[-1] == "b-late", "a free slot at arrival takes the fast path, whatever the rate"
    assert (h.controller.serving_rate_per_s("batch") or 0.0) > 0.0
    await late.release()


async def test_early_refusal_when_the_running_cohort_frees_no_slot_in_time() -> None:
    """4 slots taken together by a cohort that holds them ~4 s: the average rate (8 dispatches in 4 s)
    says an arrival would wait about half a second, but no slot frees up within its 2 s limit — it is
    refused at once. 2.5 s later the cohort is due within 2 s and an arrival queues."""
    classes = (PriorityClass("critical", 30.0), PriorityClass("interactive", 2.0))
    h = make_harness(slots=4, classes=classes, early_refusal_ratio=1.0)
    first = [await h.controller.admit(req(f"a{n}")) for n in range(4)]
    h.clock.advance(4.0)
    for grant in first:
        await grant.release()
    cohort = [await h.controller.admit(req(f"b{n}")) for n in range(4)]
    rate = h.controller.serving_rate_per_s("interactive")
    assert rate is not None and 1 / rate < 2.0, "the rate alone would queue it"
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("too-early"))
    assert refused.value.reason is RejectReason.QUEUE_FULL
    assert "not expected to free them in time" in str(refused.value)
    h.clock.advance(2.5)
    waiter = asyncio.create_task(h.controller.admit(req("in-time")))
    await settle()
    assert not waiter.done(), "the cohort is due within 2 s: it waits"
    await cohort[0].release()
    await settle()
    assert h.fleet.dispatched[-1] == "in-time"
    for grant in (*cohort, await waiter):
        await grant.release()
    assert h.fleet.in_use == 0
