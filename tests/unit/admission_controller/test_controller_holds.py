"""Holds (admission/holds.py): a waiter that would rather wait for its own replica is passed over by the
pump (those behind it take the free slot), goes to its replica when that one frees, spills when its
hold runs out, still times out at its class's max wait, and leaves nothing held behind. Each waiter
that held is reported once as `held` and once by how it left (`owner`, `spilled`, `refused`,
`cancelled`), with the time since its first hold."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from admission.config import AdmissionConfig
from admission.controller import AdmissionController
from admission.hold_times import DEFAULT_MIN_SAMPLES
from admission.holds import Hold, WaitContext
from admission.outcomes import AdmissionRefused, HoldOutcome, RejectReason
from admission.tenant_gate import TenantGate
from admission.tenants import Tenant
from admission.ticket import AdmissionRequest, Ticket
from admission.timers import ManualTimers
from core.clock import FakeClock
from router.types import RoutingRequest

from .fakes import settle


class Slot:
    def __init__(self, fleet: KeyedFleet, replica: str, label: str) -> None:
        self.fleet, self.replica, self.label = fleet, replica, label
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.fleet.in_use[self.replica] -= 1
        assert self.fleet.controller is not None
        self.fleet.controller.on_release()


@dataclass
class KeyedFleet:
    """Replicas with caps; a request's owner travels in `routing.session_key`. `try_dispatch` takes the
    owner when it has room, else the first replica with room; the hook holds for a full owner while
    another replica has room, until `budget_s` after the waiter arrived (None: never hold). A `batch`
    request may fill each cap but `batch_reserve` slots (the lowest class's share of a learned cap)."""

    caps: dict[str, int]
    budget_s: float | None = 3.0
    in_use: dict[str, int] = field(default_factory=dict)
    placed: list[tuple[str, str]] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    contexts: list[WaitContext] = field(default_factory=list)
    ahead_seen: list[dict[str, int]] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)
    batch_reserve: int = 0
    controller: AdmissionController[Slot] | None = None

    def __post_init__(self) -> None:
        self.in_use = dict.fromkeys(self.caps, 0)

    def has_room(self, replica: str, priority: str = "interactive") -> bool:
        reserve = self.batch_reserve if priority == "batch" else 0
        return self.in_use[replica] < self.caps[replica] - reserve

    def try_dispatch(self, request: AdmissionRequest) -> Slot | None:
        label, owner, priority = _label(request), _owner(request), request.priority
        free = (
            [owner]
            if self.has_room(owner, priority)
            else [r for r in self.caps if self.has_room(r, priority)]
        )
        if not free:
            return None
        self.in_use[free[0]] += 1
        self.placed.append((label, free[0]))
        return Slot(self, free[0], label)

    def prefer_wait(self, request: AdmissionRequest, context: WaitContext) -> Hold | None:
        label, owner = _label(request), _owner(request)
        self.asked.append(label)
        self.contexts.append(context)
        self.ahead_seen.append(dict(context.ahead_by_key))
        if label in self.fail:
            raise RuntimeError(f"hook failed for {label}")
        room = [self.has_room(replica, request.priority) for replica in self.caps]
        if self.budget_s is None or self.has_room(owner, request.priority) or not any(room):
            return None
        return Hold(owner, context.now_s - context.waited_s + self.budget_s)


class HoldRecorder:
    """An `AdmissionObserver` that keeps the hold reports (outcome, seconds since the first hold)."""

    def __init__(self) -> None:
        self.holds: list[tuple[HoldOutcome, float]] = []

    def queue_depth_changed(self, priority: str, depth: int) -> None:
        pass

    def dispatched(self, priority: str, queue_wait_s: float) -> None:
        pass

    def rejected(self, reason: RejectReason, priority: str) -> None:
        pass

    def held(self, outcome: HoldOutcome, held_s: float) -> None:
        self.holds.append((outcome, held_s))

    def outcomes(self) -> list[HoldOutcome]:
        return [outcome for outcome, _ in self.holds]


@dataclass
class Harness:
    clock: FakeClock
    timers: ManualTimers
    fleet: KeyedFleet
    controller: AdmissionController[Slot]
    observer: HoldRecorder

    def admit(self, label: str, owner: str, priority: str = "interactive") -> asyncio.Task[Ticket[Slot]]:
        routing = RoutingRequest(model="m", prompt_text=label, session_key=owner)
        request = AdmissionRequest(Tenant("t"), priority, 100, routing)
        return asyncio.create_task(self.controller.admit(request))


def make(
    caps: dict[str, int],
    budget_s: float | None = 3.0,
    early_refusal_ratio: float | None = None,
    keyed: bool = True,
    batch_reserve: int = 0,
) -> Harness:
    clock = FakeClock(start_s=1000.0)
    timers = ManualTimers(clock)
    fleet = KeyedFleet(caps, budget_s, batch_reserve=batch_reserve)
    observer = HoldRecorder()
    gate = TenantGate.in_memory(clock, timers)
    config = AdmissionConfig(early_refusal_ratio=early_refusal_ratio)
    controller: AdmissionController[Slot] = AdmissionController(
        fleet.try_dispatch,
        gate,
        clock=clock,
        config=config,
        timers=timers,
        observer=observer,
        prefer_wait=fleet.prefer_wait,
        slot_key=(lambda slot: slot.replica) if keyed else None,
    )
    fleet.controller = controller
    return Harness(clock, timers, fleet, controller, observer)


def _label(request: AdmissionRequest) -> str:
    assert request.routing is not None
    return request.routing.prompt_text


def _owner(request: AdmissionRequest) -> str:
    assert request.routing is not None and request.routing.session_key is not None
    return request.routing.session_key


async def granted(task: asyncio.Task[Ticket[Slot]]) -> Ticket[Slot]:
    await settle()
    assert task.done(), "expected a dispatch"
    return task.result()


async def test_a_held_waiter_is_passed_over_and_the_one_behind_takes_the_free_slot() -> None:
    h = make({"A": 1, "B": 1})
    a0, b0 = await granted(h.admit("a0", "A")), await granted(h.admit("b0", "B"))
    a1, b1 = h.admit("a1", "A"), h.admit("b1", "B")
    await settle()
    assert len(h.controller) == 2  # all full: both wait, nothing held (nothing free to hold out against)
    await b0.release()  # B frees: a1 (first in line) would rather wait for A, b1 behind it takes B
    b1_ticket = await granted(b1)
    assert not a1.done() and h.fleet.placed[-1] == ("b1", "B")
    await a0.release()
    a1_ticket = await granted(a1)
    assert h.fleet.placed[-1] == ("a1", "A")
    assert a1_ticket.queue_wait_s == 0.0  # no time passed on the fake clock
    for ticket in (a1_ticket, b1_ticket):
        await ticket.release()
    assert h.fleet.in_use == {"A": 0, "B": 0} and len(h.controller) == 0 and h.timers.pending == 0


async def test_an_arrival_whose_owner_is_full_waits_for_it_and_later_arrivals_take_the_free_slot() -> None:
    h = make({"A": 1, "B": 1})
    a0 = await granted(h.admit("a0", "A"))
    a1 = h.admit("a1", "A")  # A full, B free: held, not sent to B
    await settle()
    assert not a1.done() and h.fleet.in_use == {"A": 1, "B": 0}
    assert h.timers.next_when_s() == pytest.approx(1003.0)  # the hold's end, before the 10 s expiry
    b1 = h.admit("b1", "B")  # queued behind a1 (no fast path); the last round held out, so it pumps
    b1_ticket = await granted(b1)
    assert h.fleet.placed[-1] == ("b1", "B")
    h.clock.advance(1.0)
    await a0.release()
    a1_ticket = await granted(a1)
    assert h.fleet.placed[-1] == ("a1", "A") and a1_ticket.queue_wait_s == pytest.approx(1.0)
    await a1_ticket.release()
    await b1_ticket.release()
    assert h.fleet.in_use == {"A": 0, "B": 0} and h.timers.pending == 0


async def test_a_waiter_whose_owner_never_frees_spills_when_its_hold_runs_out() -> None:
    h = make({"A": 1, "B": 1}, budget_s=3.0)
    a0 = await granted(h.admit("a0", "A"))  # never released while a1 waits
    a1 = h.admit("a1", "A")
    await settle()
    h.timers.advance(2.9)
    await settle()
    assert not a1.done()
    h.timers.advance(0.1)  # the hold ends: the timer's pump lets it take B
    ticket = await granted(a1)
    assert h.fleet.placed[-1] == ("a1", "B") and ticket.queue_wait_s == pytest.approx(3.0)
    await ticket.release()
    await a0.release()
    assert h.fleet.in_use == {"A": 0, "B": 0} and len(h.controller) == 0 and h.timers.pending == 0


async def test_queue_timeout_still_answers_at_max_wait_whatever_the_hold_says() -> None:
    h = make({"A": 1, "B": 1}, budget_s=100.0)  # a hook that would hold past the 10 s interactive limit
    a0 = await granted(h.admit("a0", "A"))
    a1 = h.admit("a1", "A")
    await settle()
    h.timers.advance(9.99)
    await settle()
    assert not a1.done()
    h.timers.advance(0.01)
    await settle()
    with pytest.raises(AdmissionRefused) as refused:
        a1.result()
    assert refused.value.reason is RejectReason.QUEUE_TIMEOUT
    await a0.release()
    assert h.fleet.in_use == {"A": 0, "B": 0} and len(h.controller) == 0 and h.timers.pending == 0


async def test_one_hook_call_per_held_key_per_round_and_the_ones_ahead_are_counted() -> None:
    h = make({"A": 1, "B": 1, "C": 1}, budget_s=5.0)
    a0 = await granted(h.admit("a0", "A"))
    held = [h.admit(f"a{n}", "A") for n in range(1, 6)]
    await settle()
    assert len(h.controller) == 5 and h.fleet.in_use == {"A": 1, "B": 0, "C": 0}
    # each arrival behind holders runs a round with it in the queue: one hook call for the held key
    # (a1, first in line) and one for the arrival, which counts the holders before it
    seen = dict(zip(h.fleet.asked, h.fleet.ahead_seen, strict=True))
    assert h.fleet.asked[2:] == ["a1", "a2", "a1", "a3", "a1", "a4", "a1", "a5"]
    assert [seen[f"a{n}"] for n in range(2, 6)] == [{"A": n} for n in range(1, 5)]
    h.fleet.asked.clear()
    h.controller.on_release()  # a round with nothing freed at A: only the first holder is asked
    await settle()
    assert h.fleet.asked == ["a1"] and h.fleet.ahead_seen[-1] == {}
    h.clock.advance(0.5)
    await a0.release()  # A frees: a1 takes it; a2 is asked (A is full again) and holds; a3..a5 are not
    await settle()
    assert held[0].done() and h.fleet.asked[1:] == ["a1", "a2"]
    assert h.fleet.contexts[-1].waited_s == pytest.approx(0.5) and h.fleet.ahead_seen[-1] == {}
    h.controller.on_release()
    await settle()
    assert h.fleet.asked[3:] == ["a2"]
    h.timers.advance(4.5)  # every hold ends (5 s after arrival): two spill to B and C, two wait on
    await settle()
    spilled = [t for t in held[1:] if t.done()]
    assert sorted(t.result().slot().replica for t in spilled) == ["B", "C"]
    assert [label for label, _ in h.fleet.placed[-2:]] == ["a2", "a3"]  # in queue order
    for task in [held[0], *spilled]:
        await task.result().release()
    await settle()
    for task in held:
        await (await granted(task)).release()
    assert h.fleet.in_use == {"A": 0, "B": 0, "C": 0} and len(h.controller) == 0 and h.timers.pending == 0


async def test_an_arrival_behind_holders_gets_a_round_before_early_refusal_is_asked() -> None:
    """Early refusal counts every waiter ahead, but waiters holding for their own replica declined the
    free one: an arrival behind them gets a round first — dispatched when a slot is free for it,
    refused at once (not left queued) when none is."""
    h = make({"A": 1, "B": 1}, budget_s=30.0, early_refusal_ratio=0.25)  # B = 2.5 s for interactive
    for n in range(20):  # evidence for the capacity: every slot held 1 s
        a, b = await granted(h.admit(f"a{n}", "A")), await granted(h.admit(f"b{n}", "B"))
        h.clock.advance(1.0)
        await a.release()
        await b.release()
    x0 = await granted(h.admit("x0", "A"))
    held = [h.admit(f"x{n}", "A") for n in range(1, 7)]  # A full, B free: each holds for A
    await settle()
    assert len(h.controller) == 6 and not any(task.done() for task in held)
    capacity = h.controller.capacity_rate_per_s()
    assert capacity is not None and capacity * 2.5 < 6 + 1  # early refusal alone would refuse the next
    y = await granted(h.admit("y", "B"))  # B is free: the round gives it B
    assert h.fleet.placed[-1] == ("y", "B") and y.queue_wait_s == 0.0
    with pytest.raises(AdmissionRefused) as refused:
        await h.admit("z", "B")  # nothing free for anyone: the round finds none, early refusal answers
    assert refused.value.reason is RejectReason.QUEUE_FULL and len(h.controller) == 6
    await y.release()
    await x0.release()
    for task in held:
        await (await granted(task)).release()
    assert h.fleet.in_use == {"A": 0, "B": 0} and len(h.controller) == 0 and h.timers.pending == 0


async def test_an_arrival_behind_holders_gets_a_round_when_the_last_stopped_on_a_class_below() -> None:
    """A round that stopped on a batch waiter saw only batch's share of the caps: an interactive
    arrival behind interactive waiters holding for their own replica still gets a round, and takes the
    slot batch may not fill (before: queued behind the holders without one, or refused at arrival)."""
    h = make({"A": 1, "B": 2}, budget_s=30.0, batch_reserve=1)
    x0 = await granted(h.admit("x0", "A"))  # A full
    b0 = await granted(h.admit("b0", "B", "batch"))  # B full for batch, one slot left for the others
    held = [h.admit(f"x{n}", "A") for n in (1, 2)]  # A full, B has room: each holds for A
    waiting = h.admit("w", "B", "batch")  # no room for batch anywhere: the round stops on it
    await settle()
    assert len(h.controller) == 3 and not waiting.done() and not any(task.done() for task in held)
    y = await granted(h.admit("y", "B"))  # behind the holders: a round of its own finds B's last slot
    assert h.fleet.placed[-1] == ("y", "B") and y.queue_wait_s == 0.0
    z = h.admit("z", "B")  # nothing free for anyone now: it waits, no round dispatches it
    await settle()
    assert not z.done() and len(h.controller) == 4
    for ticket in (y, b0, x0):
        await ticket.release()
    for task in (*held, z, waiting):
        await (await granted(task)).release()
    assert h.fleet.in_use == {"A": 0, "B": 0} and len(h.controller) == 0 and h.timers.pending == 0


async def test_a_hook_error_fails_only_that_waiter() -> None:
    h = make({"A": 1, "B": 1})
    a0, b0 = await granted(h.admit("a0", "A")), await granted(h.admit("b0", "B"))
    bad, good = h.admit("bad", "A"), h.admit("good", "B")
    await settle()
    h.fleet.fail.add("bad")
    await b0.release()
    await settle()
    assert isinstance(bad.exception(), RuntimeError)
    ticket = await granted(good)
    assert h.fleet.placed[-1] == ("good", "B")
    await ticket.release()
    await a0.release()
    assert h.fleet.in_use == {"A": 0, "B": 0} and len(h.controller) == 0


async def test_a_cancelled_holder_leaves_and_its_hold_no_longer_wakes_the_queue() -> None:
    h = make({"A": 1, "B": 1})
    a0 = await granted(h.admit("a0", "A"))
    a1 = h.admit("a1", "A")
    await settle()
    a1.cancel()
    await settle()
    assert len(h.controller) == 0 and h.timers.pending == 0
    await a0.release()
    assert h.fleet.in_use == {"A": 0, "B": 0}


async def test_no_waiter_starves_and_every_count_returns_to_zero_under_churn() -> None:
    h = make({"A": 2, "B": 2, "C": 2}, budget_s=1.5)
    owners = "AABACAABBCAAAB" * 3
    tasks = [h.admit(f"r{n}", owner) for n, owner in enumerate(owners)]
    await settle()
    for _ in range(60):
        h.timers.advance(0.25)
        await settle()
        running = [
            t.result() for t in tasks if t.done() and t.exception() is None and not t.result().released
        ]
        if running:
            await running[0].release()  # the oldest held slot frees, one every 0.25 s
        await settle()
    for task in tasks:
        assert task.done(), "answered: dispatched or refused at its max wait"
        if task.exception() is None and not task.result().released:
            await task.result().release()
    refused = [t for t in tasks if t.exception() is not None]
    assert all(isinstance(t.exception(), AdmissionRefused) for t in refused)
    assert h.fleet.in_use == {"A": 0, "B": 0, "C": 0} and len(h.controller) == 0
    assert h.controller.held_tickets() == 0 and h.timers.pending == 0


@pytest.mark.parametrize("keyed", [True, False])
async def test_the_hook_sees_each_replicas_own_mean_hold_once_it_has_enough_holds(keyed: bool) -> None:
    h = make({"A": 1, "B": 1}, budget_s=None, keyed=keyed)  # the hook never holds: only its contexts
    for n in range(DEFAULT_MIN_SAMPLES):
        a, b = await granted(h.admit(f"a{n}", "A")), await granted(h.admit(f"b{n}", "B"))
        assert h.fleet.contexts[-1].mean_hold_s_by_key == {}, "no replica has enough holds yet"
        h.clock.advance(1.0)
        await a.release()  # A holds 1 s
        h.clock.advance(2.0)
        await b.release()  # B holds 3 s
    last = await granted(h.admit("last", "A"))
    seen = dict(h.fleet.contexts[-1].mean_hold_s_by_key)  # a live view: read before the next release
    assert seen == ({"A": pytest.approx(1.0), "B": pytest.approx(3.0)} if keyed else {})
    assert 1.0 < (h.fleet.contexts[-1].mean_hold_s or 0.0) < 3.0  # the pool's S mixes both
    await last.release()


HELD, OWNER, SPILLED = HoldOutcome.HELD, HoldOutcome.OWNER, HoldOutcome.SPILLED
REFUSED, CANCELLED = HoldOutcome.REFUSED, HoldOutcome.CANCELLED


async def test_a_holder_served_by_its_owner_is_reported_held_then_owner_with_its_wait() -> None:
    h = make({"A": 1, "B": 1})
    a0 = await granted(h.admit("a0", "A"))
    a1 = h.admit("a1", "A")
    await settle()
    assert h.observer.holds == [(HELD, 0.0)]
    h.clock.advance(1.5)
    h.controller.on_release()  # asked again (nothing freed at A): still held, not counted twice
    await settle()
    await a0.release()
    ticket = await granted(a1)
    assert h.observer.holds == [(HELD, 0.0), (OWNER, pytest.approx(1.5))]
    assert h.controller.stats.holds == {HELD: 1, OWNER: 1}
    await ticket.release()


async def test_a_holder_whose_hold_runs_out_is_reported_spilled() -> None:
    h = make({"A": 1, "B": 1}, budget_s=3.0)
    a0 = await granted(h.admit("a0", "A"))
    a1 = h.admit("a1", "A")
    await settle()
    h.timers.advance(3.0)
    ticket = await granted(a1)
    assert ticket.slot().replica == "B"
    assert h.observer.holds == [(HELD, 0.0), (SPILLED, pytest.approx(3.0))]
    await ticket.release()
    await a0.release()


async def test_a_holder_that_times_out_is_reported_refused() -> None:
    h = make({"A": 1, "B": 1}, budget_s=100.0)
    a0 = await granted(h.admit("a0", "A"))
    a1 = h.admit("a1", "A")
    await settle()
    h.timers.advance(10.0)  # interactive max wait
    await settle()
    assert isinstance(a1.exception(), AdmissionRefused)
    assert h.observer.holds == [(HELD, 0.0), (REFUSED, pytest.approx(10.0))]
    await a0.release()


async def test_a_holder_whose_caller_leaves_is_reported_cancelled_once() -> None:
    h = make({"A": 1, "B": 1})
    a0 = await granted(h.admit("a0", "A"))
    a1 = h.admit("a1", "A")
    await settle()
    h.clock.advance(0.5)
    a1.cancel()
    await settle()
    await a0.release()  # A frees: nobody is held for it any more
    await settle()
    assert h.observer.holds == [(HELD, 0.0), (CANCELLED, pytest.approx(0.5))]
    assert len(h.controller) == 0 and h.timers.pending == 0


async def test_a_holder_refused_by_the_hook_or_at_shutdown_is_reported_refused() -> None:
    h = make({"A": 1, "B": 1}, budget_s=100.0)
    a0 = await granted(h.admit("a0", "A"))
    bad, drained = h.admit("bad", "A"), h.admit("drained", "A")
    await settle()
    assert h.observer.outcomes() == [HELD, HELD]
    h.fleet.fail.add("bad")
    h.controller.on_release()
    await settle()
    assert isinstance(bad.exception(), RuntimeError)
    h.controller.reject_waiting(RejectReason.DRAINING, 1, "shutting down")
    await settle()
    assert isinstance(drained.exception(), AdmissionRefused)
    assert h.observer.outcomes() == [HELD, HELD, REFUSED, REFUSED]
    await a0.release()


async def test_a_waiter_that_never_held_is_not_reported() -> None:
    h = make({"A": 1, "B": 1})
    a0, b0 = await granted(h.admit("a0", "A")), await granted(h.admit("b0", "B"))
    a1 = h.admit("a1", "A")  # all full: queued without a hold
    await settle()
    await a0.release()
    await (await granted(a1)).release()
    await b0.release()
    assert h.observer.holds == [] and not h.controller.stats.holds


async def test_under_churn_every_holder_is_reported_held_once_and_ended_once() -> None:
    h = make({"A": 2, "B": 2, "C": 2}, budget_s=1.5)
    owners = "AABACAABBCAAAB" * 3
    tasks = [h.admit(f"r{n}", owner) for n, owner in enumerate(owners)]
    await settle()
    for _ in range(60):
        h.timers.advance(0.25)
        await settle()
        running = [
            t.result() for t in tasks if t.done() and t.exception() is None and not t.result().released
        ]
        if running:
            await running[0].release()
        await settle()
    for task in tasks:
        if task.done() and task.exception() is None and not task.result().released:
            await task.result().release()
    counts = h.controller.stats.holds
    assert 0 < counts[HELD] <= len(tasks)
    assert counts[HELD] == counts[OWNER] + counts[SPILLED] + counts[REFUSED] + counts[CANCELLED]
    assert counts[OWNER] > 0 and counts[SPILLED] > 0, counts
    assert all(held_s >= 0.0 for _, held_s in h.observer.holds)
