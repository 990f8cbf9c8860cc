"""Early refusal: an arrival that cannot be dispatched within ratio × its class's max wait is refused at
once (429 queue_full) — by capacity (C = held grants ÷ mean hold time, minus what the classes above
take, with a margin for their bursts) and by the release forecast of the grants held now. And the
cases where it must not refuse: light lower classes, no local grants, first in line with shared
credits, infinite waits."""

import asyncio
import math

import pytest

from admission.dispatch_rate import RECENT_TIME_CONSTANT_S
from admission.early_refusal import Hopeless, hopeless
from admission.outcomes import AdmissionRefused, RejectReason
from admission.priority_classes import PriorityClass
from admission.release_forecast import ReleaseForecast
from admission.ticket import Ticket
from core.clock import FakeClock

from .fakes import Harness, Slot, make_harness, req, run_scheduled_pump, settle

CLASSES = (
    PriorityClass("critical", 30.0),
    PriorityClass("interactive", 4.0),
    PriorityClass("batch", 300.0),
)


async def _steady(
    h: Harness, per_round: dict[str, int], rounds: int, hold_s: float = 1.0
) -> list[Ticket[Slot]]:
    """`rounds` rounds: let `hold_s` pass, release everything held, dispatch `per_round` (fast path).
    Returns the last round's grants, still held: the pool is full of one cohort."""
    held: list[Ticket[Slot]] = []
    for _ in range(rounds):
        h.clock.advance(hold_s)
        for grant in held:
            await grant.release()
        held = [
            await h.controller.admit(req(f"{name}{n}", name))
            for name, count in per_round.items()
            for n in range(count)
        ]
    return held


def _need(h: Harness, priority: str, ahead: int, budget_s: float, margin: bool = True) -> float:
    above = h.controller.above_rate_per_s(priority)
    return ahead + 1 + above * budget_s + (2 * math.sqrt(above * budget_s) if margin else 0.0)


async def _queue(h: Harness, priority: str, count: int) -> list[asyncio.Task[Ticket[Slot]]]:
    tasks = [asyncio.create_task(h.controller.admit(req(f"{priority}-w{n}", priority))) for n in range(count)]
    await settle()
    assert not any(task.done() for task in tasks)
    return tasks


async def _finish(h: Harness, held: list[Ticket[Slot]], tasks: list[asyncio.Task[Ticket[Slot]]]) -> None:
    for task in tasks:
        task.cancel()
    await settle()
    for grant in held:
        await grant.release()
    assert h.fleet.in_use == 0 and h.controller.held_tickets() == 0


async def test_a_queue_that_cannot_drain_in_time_is_refused_at_once() -> None:
    h = make_harness(slots=20, classes=CLASSES, early_refusal_ratio=0.25)  # B = 1 s for interactive
    held = await _steady(h, {"interactive": 20}, rounds=20)
    assert h.controller.capacity_rate_per_s() == pytest.approx(20.0)
    waiters = await _queue(h, "interactive", 20)  # ahead + 1 ≤ C × B = 20 slots freed in 1 s: queued
    with pytest.raises(AdmissionRefused) as refused:
        await asyncio.wait_for(h.controller.admit(req("twenty-first")), timeout=1)
    assert refused.value.reason is RejectReason.QUEUE_FULL
    assert "would take about 1.1 s, over its 4 s limit" in str(refused.value)
    assert "twenty-first" not in h.fleet.asked
    assert refused.value.retry_after_s == 2  # the expected wait, (20 + 1) ÷ 20/s, rounded up
    await _finish(h, held, waiters)


async def test_the_higher_classes_that_will_overtake_are_counted() -> None:
    """Critical takes ~10 of the 20 dispatches/s. An interactive arrival behind 10 critical waiters
    needs 11 releases plus the ~10 critical arrivals expected in B = 1 s: more than the 20 that free
    up, though the 11 alone would fit."""
    h = make_harness(slots=20, classes=CLASSES, early_refusal_ratio=0.25)
    held = await _steady(h, {"critical": 10, "interactive": 10}, rounds=20)
    capacity = h.controller.capacity_rate_per_s()
    assert capacity == pytest.approx(20.0)
    waiters = await _queue(h, "critical", 10)  # the top class: nothing overtakes it, 11 ≤ 20 fits
    assert 10 + 1 <= capacity * 1.0 < _need(h, "interactive", ahead=10, budget_s=1.0, margin=False)
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("overtaken"))
    assert refused.value.reason is RejectReason.QUEUE_FULL
    assert "over its 4 s limit" in str(refused.value)
    await _finish(h, held, waiters)


async def test_the_margin_for_a_burst_of_higher_class_arrivals_decides_close_cases() -> None:
    h = make_harness(slots=20, classes=CLASSES, early_refusal_ratio=0.25)
    held = await _steady(h, {"critical": 10, "interactive": 10}, rounds=20)
    capacity = h.controller.capacity_rate_per_s()
    assert capacity is not None
    ahead = 3
    assert _need(h, "interactive", ahead, 1.0, margin=False) <= capacity < _need(h, "interactive", ahead, 1.0)
    waiters = await _queue(h, "critical", ahead)  # critical waiters are ahead of interactive
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("close-call"))
    assert "burst" in str(refused.value)
    await _finish(h, held, waiters)


async def test_a_class_the_classes_above_leave_nothing_is_refused_and_recovers_at_a_free_slot() -> None:
    """Interactive fills all 4 slots every 2 s: C = 2/s and, read just after a round, the interactive
    rate is at least that. Batch is refused at once, with its class's max wait as Retry-After (capped
    at 120 s) rather than a 1 s retry into the same state."""
    h = make_harness(slots=4, classes=CLASSES, early_refusal_ratio=0.8)
    held = await _steady(h, {"interactive": 4}, rounds=20, hold_s=2.0)
    capacity = h.controller.capacity_rate_per_s()
    assert capacity == pytest.approx(2.0)
    assert h.controller.above_rate_per_s("batch") >= capacity
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("b", "batch"))
    assert refused.value.reason is RejectReason.QUEUE_FULL
    assert "take all of this pool's capacity" in str(refused.value)
    assert refused.value.retry_after_s == 120
    await held[0].release()
    late = await h.controller.admit(req("b-late", "batch"))
    assert h.fleet.dispatched[-1] == "b-late", (
        "a free slot at arrival takes the fast path, whatever the rates"
    )
    await _finish(h, [*held[1:], late], [])


async def test_a_light_lower_class_is_not_refused_when_the_pool_is_briefly_full() -> None:
    """Interactive uses 3 of 4 slots; one batch request in the last round fills the pool. The next batch
    arrival has its own tiny rate, but capacity minus interactive leaves it ~1 dispatch/s: it queues
    (and is dispatched at the next release), far within its 300 s."""
    h = make_harness(slots=4, classes=CLASSES, early_refusal_ratio=0.8)
    held = await _steady(h, {"interactive": 3}, rounds=20)
    held.append(await h.controller.admit(req("b0", "batch")))
    waiting = asyncio.create_task(h.controller.admit(req("b1", "batch")))
    await settle()
    assert not waiting.done(), "queued, not refused"
    await held[0].release()
    await settle()
    assert h.fleet.dispatched[-1] == "b1"
    await _finish(h, [*held[1:], await waiting], [])


async def test_a_cohort_that_frees_no_slot_in_time_is_caught_by_the_forecast() -> None:
    """4 slots taken together by a cohort that holds them ~4 s: the capacity (4 ÷ 4 s) says one arrival
    would wait about 1 s of its 2 s, but no slot frees before +4 s. Refused at once, with Retry-After
    when a retry could be admitted: the release at +4 s minus the 2 s budget. 2.5 s later the cohort
    is due within 2 s and an arrival queues."""
    classes = (PriorityClass("critical", 30.0), PriorityClass("interactive", 2.0))
    h = make_harness(slots=4, classes=classes, early_refusal_ratio=1.0)
    cohort = await _steady(h, {"interactive": 4}, rounds=3, hold_s=4.0)
    assert h.controller.capacity_rate_per_s() == pytest.approx(1.0)
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("too-early"))
    assert "not expected to free them in time" in str(refused.value)
    assert refused.value.retry_after_s == 2
    h.clock.advance(2.5)
    waiter = asyncio.create_task(h.controller.admit(req("in-time")))
    await settle()
    assert not waiter.done(), "the cohort is due within 2 s: it waits"
    await cohort[0].release()
    await settle()
    assert h.fleet.dispatched[-1] == "in-time"
    await _finish(h, [*cohort[1:], await waiter], [])


async def test_without_a_grant_of_its_own_the_controller_never_refuses_early() -> None:
    """The pool is full of work this controller cannot see (another instance's credits, another pool's
    connections): an arrival queues — its wait is what asks for more credits — however stale the
    rates. Found by review: it used to refuse every arrival forever after an idle period."""
    h = make_harness(slots=1, classes=CLASSES, early_refusal_ratio=0.8)
    last = await _steady(h, {"interactive": 1}, rounds=5)
    await last[0].release()
    h.fleet.slots = 0  # the credits went elsewhere
    h.clock.advance(120.0)
    waiting = asyncio.create_task(h.controller.admit(req("after-idle")))
    await settle()
    assert not waiting.done(), "queued, not refused"
    h.fleet.slots = 1
    h.controller.on_release()  # a credit arrived
    await settle()
    await _finish(h, [await waiting], [])


async def test_with_shared_credits_the_first_in_line_always_queues() -> None:
    classes = (PriorityClass("critical", 30.0), PriorityClass("interactive", 2.0))
    h = make_harness(slots=4, classes=classes, early_refusal_ratio=1.0, early_refusal_needs_queue=True)
    cohort = await _steady(h, {"interactive": 4}, rounds=3, hold_s=4.0)
    first = await _queue(h, "interactive", 1)  # hopeless by the forecast, but first in line: queued
    with pytest.raises(AdmissionRefused):
        await h.controller.admit(req("second"))
    await _finish(h, cohort, first)


async def test_an_infinite_wait_limit_never_refuses_early() -> None:
    classes = (PriorityClass("critical", math.inf), PriorityClass("interactive", 2.0))
    h = make_harness(slots=1, classes=classes, early_refusal_ratio=1.0)
    held = await _steady(h, {"critical": 1}, rounds=5)
    waiters = await _queue(h, "critical", 3)
    await _finish(h, held, waiters)


async def test_every_grant_leaves_the_forecast_on_every_path() -> None:
    """Fast path, queued dispatch, a waiter cancelled right after its dispatch, refusals: once all is
    released, the controller holds no grant (the forecast's population cannot leak)."""
    h = make_harness(slots=1, classes=CLASSES, early_refusal_ratio=1.0, max_depth=2)
    first = await h.controller.admit(req("fast"))
    queued = asyncio.create_task(h.controller.admit(req("queued")))
    doomed = asyncio.create_task(h.controller.admit(req("cancelled-after-dispatch")))
    await settle()
    with pytest.raises(AdmissionRefused):
        await h.controller.admit(req("refused"))  # the queue is at its depth of 2
    assert h.controller.held_tickets() == 1
    await first.release()
    await run_scheduled_pump()  # dispatches `queued`
    assert not queued.done(), "its task has not resumed yet"
    assert h.controller.held_tickets() == 1, "counted from its dispatch, before its task resumes"
    second = await queued
    assert h.controller.held_tickets() == 1
    await second.release()
    await run_scheduled_pump()  # dispatches `doomed` ...
    doomed.cancel()  # ... whose caller leaves in the same instant: the slot goes back, no Ticket made
    await settle()
    assert doomed.cancelled()
    assert h.controller.held_tickets() == 0 and h.fleet.in_use == 0


async def test_no_early_refusal_before_a_request_has_completed() -> None:
    """Found by the second review: before any completion the capacity fell back to the dispatch rate,
    which at start-up is the classes above's own — a batch arrival was refused as 'take all'."""
    h = make_harness(slots=4, classes=CLASSES, early_refusal_ratio=0.8)
    held = [await h.controller.admit(req(f"c{n}", "critical")) for n in range(4)]
    h.clock.advance(0.5)
    assert h.controller.capacity_rate_per_s() is None
    waiting = await _queue(h, "batch", 1)
    await _finish(h, held, waiting)


async def test_no_early_refusal_while_a_limit_shared_with_other_pools_blocks() -> None:
    """The process's upstream connection limit is shared: when it, not this pool's caps, stops the
    claim, other pools' releases free slots and this pool's forecast cannot see them."""
    from admission.config import AdmissionConfig
    from admission.controller import AdmissionController

    h = make_harness(slots=1, classes=CLASSES)
    own_caps = [True]
    controller: AdmissionController[Slot] = AdmissionController(
        h.fleet.try_dispatch,
        h.gate,
        clock=h.clock,
        config=AdmissionConfig(classes=CLASSES, early_refusal_ratio=0.25),
        timers=h.timers,
        full_by_own_caps=lambda: own_caps[0],
    )
    h.fleet.controller = controller
    h.controller = controller
    held = await _steady(h, {"interactive": 1}, rounds=5, hold_s=20.0)  # C = 0.05/s: 1 s budget hopeless
    with pytest.raises(AdmissionRefused):
        await controller.admit(req("own-caps"))
    own_caps[0] = False
    waiting = await _queue(h, "interactive", 1)
    await _finish(h, held, waiting)


async def test_before_any_request_ended_the_prior_hold_time_lets_an_onset_be_refused_at_once() -> None:
    """The first generation of a sudden overload: nothing has completed, so S is unknown — without a
    prior every arrival would queue and wait out its class's limit. The output budget (200 tokens) ×
    the engines' token latency (20 ms) says the 20 grants held free nothing for 4 s."""
    h = make_harness(
        slots=20,
        classes=CLASSES,
        early_refusal_ratio=0.25,
        output_tokens=lambda request: 200,
        seconds_per_token=lambda: 0.02,
    )
    held = [await h.controller.admit(req(f"onset{n}")) for n in range(20)]
    assert h.controller.capacity_rate_per_s() == pytest.approx(20 / 4.0)
    with pytest.raises(AdmissionRefused) as refused:  # the cohort frees nothing within B = 1 s
        await asyncio.wait_for(h.controller.admit(req("first-waiter")), timeout=1)
    assert refused.value.reason is RejectReason.QUEUE_FULL
    assert refused.value.retry_after_s == 3, "the cohort is due in 4 s, 3 s past the budget"
    h.clock.advance(3.5)
    waiters = await _queue(h, "interactive", 1)  # due within 1 s now: it may wait
    await _finish(h, held, waiters)


async def test_slots_held_above_the_caps_are_released_before_any_waiter_gets_one() -> None:
    """A learned cap cut below what runs: the first `blocked` releases free nothing for a waiter."""
    blocked = [0]
    h = make_harness(
        slots=20, classes=CLASSES, early_refusal_ratio=0.25, slots_over_caps=lambda _headroom: blocked[0]
    )
    held = await _steady(h, {"interactive": 20}, rounds=20)  # C = 20/s, B = 1 s
    waiters = await _queue(h, "interactive", 10)
    blocked[0] = 10
    with pytest.raises(AdmissionRefused):
        await asyncio.wait_for(h.controller.admit(req("eleventh")), timeout=1)
    blocked[0] = 0
    late = asyncio.create_task(h.controller.admit(req("eleventh-again")))
    await settle()
    assert not late.done(), "without the blocked slots the same arrival may wait"
    await _finish(h, held, [*waiters, late])


async def test_under_overload_the_tenant_past_its_share_is_refused_and_a_light_one_still_queues() -> None:
    """One tenant fills the queue up to what the pool frees within B; the next of its requests is
    refused, while another tenant's arrival, which fair share would dispatch before most of that
    queue, still queues — what is admitted keeps the shares, not the arrival mix."""
    from admission.tenants import Tenant

    heavy, light = Tenant("heavy"), Tenant("light")
    h = make_harness(slots=20, classes=CLASSES, early_refusal_ratio=0.25)  # B = 1 s
    held = await _steady(h, {"interactive": 20}, rounds=20)  # C = 20/s: 20 slots free within B
    waiters = [asyncio.create_task(h.controller.admit(req(f"heavy-w{n}", tenant=heavy))) for n in range(20)]
    await settle()
    assert not any(task.done() for task in waiters)
    with pytest.raises(AdmissionRefused):
        await asyncio.wait_for(h.controller.admit(req("heavy-21st", tenant=heavy)), timeout=1)
    light_waiter = asyncio.create_task(h.controller.admit(req("light-1st", tenant=light)))
    await settle()
    assert not light_waiter.done(), "behind about one heavy request, not twenty: it may wait"
    await _finish(h, held, [*waiters, light_waiter])


async def test_an_arrival_is_queued_while_the_classes_below_it_are_being_served() -> None:
    """A cold onset: a batch cohort holds every slot and frees nothing for 4 s, yet the cap grows and batch
    waiters take the new slots. By the forecast a critical arrival is hopeless (budget 2 s); but the
    queue would give it the next of those slots before any batch waiter, so it is queued and takes the
    next slot that opens. Found at 1.5× the knee: critical refused with Retry-After 15-50 s while
    interactive and batch requests were dispatched in the next second."""
    classes = (PriorityClass("critical", 2.0), PriorityClass("batch", 300.0))
    h = make_harness(slots=4, classes=classes, early_refusal_ratio=1.0)
    cohort = await _steady(h, {"batch": 4}, rounds=3, hold_s=4.0)
    with pytest.raises(AdmissionRefused) as refused:  # nothing below is served yet: the forecast decides
        await h.controller.admit(req("before", "critical"))
    assert "not expected to free them in time" in str(refused.value)
    batch = await _queue(h, "batch", 4)  # batch may wait 300 s: queued
    h.fleet.slots = 7  # the learned cap grows by three
    h.controller.on_release()
    await settle()
    assert h.fleet.dispatched[-3:] == ["batch-w0", "batch-w1", "batch-w2"]
    assert h.controller.held_tickets() == 7
    critical = asyncio.create_task(h.controller.admit(req("after", "critical")))
    await settle()
    assert not critical.done(), "queued: the slots batch is taking would be its"
    h.fleet.slots = 8
    h.controller.on_release()
    await settle()
    assert h.fleet.dispatched[-1] == "after", "the next slot goes to critical, ahead of batch-w3"
    grown = [await task for task in batch[:3]]
    await _finish(h, [*cohort, *grown, await critical], batch[3:])


def test_the_rate_below_is_extrapolated_no_further_than_it_was_measured() -> None:
    """need − blocked against λ_below × min(B, τ): 4 requests at 1/s are 2 slots within τ = 2 s, not
    the 8 a budget of 8 s would extrapolate; blocked slots do not count against it."""
    forecast = ReleaseForecast(FakeClock(start_s=0.0))

    def verdict(ahead: int, below_per_s: float, blocked: int = 0) -> Hopeless | None:
        return hopeless(
            priority="critical",
            ratio=1.0,
            max_wait_s=8.0,
            ahead=ahead,
            blocked=blocked,
            capacity_per_s=0.01,  # C × B = 0.08: hopeless by capacity alone
            above_per_s=0.0,
            forecast=forecast,
            below_per_s=below_per_s,
        )

    assert RECENT_TIME_CONSTANT_S == 2.0
    assert verdict(ahead=1, below_per_s=1.0) is None  # need 2 ≤ 1/s × 2 s
    assert verdict(ahead=1, below_per_s=1.0, blocked=5) is None
    assert verdict(ahead=2, below_per_s=1.0) is not None  # need 3 > 2, though 3 ≤ 1/s × 8 s
    assert verdict(ahead=0, below_per_s=0.0) is not None
