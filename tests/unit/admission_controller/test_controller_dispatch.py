"""Fast path, queueing, dispatch order on release (priority, FIFO, WFQ), and try_dispatch refusals."""

import asyncio

import pytest

from admission.outcomes import AdmissionRefused, RejectReason
from admission.tenants import Tenant
from admission.ticket import AdmissionRequest, Ticket

from .fakes import Harness, Slot, label_of, make_harness, req, run_scheduled_pump, settle


async def serve_in_order(
    h: Harness, tasks: list[asyncio.Task[Ticket[Slot]]], first: Ticket[Slot]
) -> list[str]:
    """Release the running grant, then each grant as it is dispatched; returns the dispatch order."""
    order: list[str] = []
    await first.release()
    for _ in tasks:
        await settle()
        done = [t for t in tasks if t.done() and not t.result().released]
        assert len(done) == 1, "exactly one waiter holds the single slot"
        grant = done[0].result()
        order.append(label_of(grant.request))
        await grant.release()
    return order


async def test_fast_path_dispatches_at_once_without_queueing() -> None:
    h = make_harness(slots=2)
    grant = await h.controller.admit(req("a"))
    assert grant.slot().label == "a" and grant.queue_wait_s == 0.0 and grant.queue_wait_ms == 0.0
    assert h.fleet.in_use == 1 and len(h.controller) == 0
    assert h.controller.stats.fast_path["interactive"] == 1
    assert h.timers.pending == 0  # nothing queued: no expiry timer
    await grant.release()
    assert h.fleet.in_use == 0
    assert h.controller.dispatch_rate_per_s() is not None


async def test_no_slot_queues_and_release_dispatches_by_priority_with_measured_wait() -> None:
    h = make_harness(slots=1)
    first = await h.controller.admit(req("running"))
    tasks = [
        asyncio.create_task(h.controller.admit(req(label, priority)))
        for label, priority in [("b1", "batch"), ("i1", "interactive"), ("c1", "critical"), ("b2", "batch")]
    ]
    await settle()
    assert h.controller.depths() == {"critical": 1, "interactive": 1, "batch": 2}
    assert not any(t.done() for t in tasks)
    assert h.timers.next_when_s() == 1010.0  # one timer, at the earliest deadline (interactive: 10 s)
    h.clock.advance(2.5)
    order = await serve_in_order(h, tasks, first)
    assert order == ["c1", "i1", "b1", "b2"]
    assert tasks[2].result().queue_wait_s == pytest.approx(2.5)
    assert tasks[2].result().queue_wait_ms == pytest.approx(2500.0)
    assert len(h.controller) == 0 and h.fleet.in_use == 0 and h.timers.pending == 0


async def test_fifo_within_a_class() -> None:
    h = make_harness(slots=1)
    first = await h.controller.admit(req("running"))
    tasks = []
    for n in range(6):
        tasks.append(asyncio.create_task(h.controller.admit(req(f"i{n}"))))
        await settle()
        h.clock.advance(0.1)
    assert await serve_in_order(h, tasks, first) == [f"i{n}" for n in range(6)]


async def test_arrival_of_equal_priority_never_overtakes_waiters() -> None:
    h = make_harness(slots=1)
    first = await h.controller.admit(req("running"))
    waiting = asyncio.create_task(h.controller.admit(req("waiting")))
    await settle()
    first.slot().release()  # slot freed → the waiter gets it, not a later arrival
    late = asyncio.create_task(h.controller.admit(req("late")))
    await settle()
    assert waiting.done() and not late.done()
    assert h.fleet.dispatched == ["running", "waiting"]
    await first.release()
    await waiting.result().release()
    await settle()
    assert late.done()
    await late.result().release()


async def test_fair_share_light_tenant_is_not_starved_by_a_flood_of_long_requests() -> None:
    h = make_harness(slots=1)
    heavy, light = Tenant("heavy"), Tenant("light")
    first = await h.controller.admit(req("h0", tokens=4000, tenant=heavy))
    tasks = []
    for n in range(1, 20):
        tasks.append(asyncio.create_task(h.controller.admit(req(f"h{n}", tokens=4000, tenant=heavy))))
    await settle()
    for n in range(3):
        tasks.append(asyncio.create_task(h.controller.admit(req(f"l{n}", tokens=100, tenant=light))))
    await settle()
    order = await serve_in_order(h, tasks, first)
    light_positions = [order.index(f"l{n}") for n in range(3)]
    assert light_positions == sorted(light_positions)  # FIFO within the light tenant
    assert max(light_positions) <= 3  # served at once, not behind 19 long requests (FIFO: 19..21)
    assert [label for label in order if label.startswith("h")] == [f"h{n}" for n in range(1, 20)]


async def test_fair_share_follows_weights_while_both_tenants_are_backlogged() -> None:
    h = make_harness(slots=1)
    gold, bronze = Tenant("gold", weight=2.0), Tenant("bronze", weight=1.0)
    first = await h.controller.admit(req("start"))
    tasks = []
    for n in range(12):
        tasks.append(asyncio.create_task(h.controller.admit(req(f"g{n}", tokens=500, tenant=gold))))
        tasks.append(asyncio.create_task(h.controller.admit(req(f"b{n}", tokens=500, tenant=bronze))))
    await settle()
    order = await serve_in_order(h, tasks, first)
    first_nine = order[:9]
    assert sum(label.startswith("g") for label in first_nine) == 6  # 2:1 while both are backlogged


async def test_on_release_dispatches_as_many_waiters_as_fit() -> None:
    h = make_harness(slots=1)
    first = await h.controller.admit(req("running"))
    tasks = [asyncio.create_task(h.controller.admit(req(f"w{n}"))) for n in range(4)]
    await settle()
    asked_before = len(h.fleet.asked)
    h.fleet.slots = 3  # e.g. a replica was added: capacity appeared without a release
    h.controller.on_release()
    await settle()
    assert [t.done() for t in tasks] == [True, True, False, False]
    assert h.fleet.asked[asked_before:] == ["w0", "w1", "w2"]  # stops at the first None
    for task in tasks[:2]:
        await task.result().release()
    await first.release()
    await settle()
    for task in tasks[2:]:
        await task.result().release()
    assert h.fleet.in_use == 0


async def test_try_dispatch_refusal_propagates_on_the_fast_path_and_fails_only_that_waiter() -> None:
    h = make_harness(slots=1)
    no_replica = AdmissionRefused(RejectReason.NO_REPLICA, 7, "no eligible replica")
    refuse = {"x"}

    def try_dispatch(request: AdmissionRequest) -> Slot | None:
        if label_of(request) in refuse:
            raise no_replica
        return h.fleet.try_dispatch(request)

    h.controller._try_dispatch = h.controller._queue_pump._try_dispatch = try_dispatch  # test seam
    with pytest.raises(AdmissionRefused) as fast:
        await h.controller.admit(req("x"))
    assert fast.value.reason is RejectReason.NO_REPLICA and fast.value.retry_after_s == 7
    first = await h.controller.admit(req("running"))
    doomed = asyncio.create_task(h.controller.admit(req("x")))
    fine = asyncio.create_task(h.controller.admit(req("ok")))
    await settle()
    await first.release()
    await settle()
    assert isinstance(doomed.exception(), AdmissionRefused)
    assert fine.done() and label_of(fine.result().request) == "ok"
    assert h.controller.stats.rejected[RejectReason.NO_REPLICA] == 2
    await fine.result().release()


async def test_unknown_priority_and_negative_tokens_are_programming_errors() -> None:
    h = make_harness()
    with pytest.raises(ValueError, match="unknown priority class"):
        await h.controller.admit(req("a", priority="urgent"))
    with pytest.raises(ValueError, match="estimated_tokens"):
        await h.controller.admit(req("a", tokens=-1))
    assert h.fleet.asked == []


async def test_a_release_schedules_the_pump_and_never_runs_it_in_place() -> None:
    """Releases only schedule the pump (`call_soon`): nothing is dispatched inside `on_release` (so a
    slot released from within `try_dispatch` or another pump cannot re-enter it), and many releases
    in one loop iteration cost one pump round."""
    h = make_harness(slots=3)
    running = [await h.controller.admit(req(f"r{n}")) for n in range(3)]
    tasks = [asyncio.create_task(h.controller.admit(req(f"w{n}"))) for n in range(3)]
    await settle()
    asked_before = len(h.fleet.asked)
    for ticket in running:
        slot = ticket.slot()
        assert slot is not None
        slot.release()  # each calls on_release
        assert h.fleet.in_use < 3 and h.fleet.asked[asked_before:] == [], "nothing dispatched in place"
    await run_scheduled_pump()
    assert h.fleet.asked[asked_before:] == ["w0", "w1", "w2"], "one round served all three, in order"
    await settle()
    assert all(t.done() for t in tasks)
    for ticket in [*running, *(t.result() for t in tasks)]:
        await ticket.release()
    assert h.fleet.in_use == 0
