"""The ticket is the one holder of a request's slots, tenant pass and forecast key."""

from __future__ import annotations

from admission.release_forecast import ReleaseForecast
from admission.tenant_gate import TenantGate
from admission.tenants import Tenant
from admission.ticket import AdmissionRequest, SlotRole, SlotSet, Ticket
from admission.timers import ManualTimers
from core.clock import FakeClock


class FakeSlot:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.log.append(self.name)


async def make_ticket(
    slot: FakeSlot | SlotSet[FakeSlot], tenant: Tenant
) -> tuple[Ticket[FakeSlot], TenantGate, ReleaseForecast]:
    clock = FakeClock(start_s=10.0)
    gate = TenantGate.in_memory(clock, ManualTimers(clock))
    forecast = ReleaseForecast(clock)
    tenant_pass = await gate.enter(tenant, 100)
    ticket = Ticket(
        slot,
        AdmissionRequest(tenant, "interactive", 100),
        queue_wait_s=0.0,
        gate=gate,
        tenant_pass=tenant_pass,
        clock=clock,
        forecast=forecast,
        hold_key=forecast.hold(),
    )
    return ticket, gate, forecast


async def test_a_retry_swaps_the_slot_and_keeps_the_pass_and_forecast_key() -> None:
    log: list[str] = []
    first, second = FakeSlot("first", log), FakeSlot("second", log)
    tenant = Tenant("acme", max_concurrent=1)
    ticket, gate, forecast = await make_ticket(first, tenant)
    ticket.swap(SlotRole.SERVE, None)  # the failed try's slot goes back before the backoff
    assert log == ["first"] and ticket.slot() is None and len(forecast) == 1
    ticket.swap(SlotRole.SERVE, second)
    assert ticket.slot() is second and not second.released
    assert await gate.tenant_leases.count("acme") == 1, "the bulkhead lease stays with the request"
    await ticket.release()
    assert log == ["first", "second"] and len(forecast) == 0
    assert await gate.tenant_leases.count("acme") == 0


async def test_release_frees_every_role_once_and_a_late_swap_cannot_leak() -> None:
    log: list[str] = []
    ticket, _, forecast = await make_ticket(FakeSlot("decode", log), Tenant("t"))
    ticket.swap(SlotRole.PREFILL, FakeSlot("prefill", log))
    assert set(ticket.slots) == {SlotRole.SERVE, SlotRole.PREFILL}
    await ticket.release()
    await ticket.release()
    assert sorted(log) == ["decode", "prefill"] and ticket.released and not ticket.slots
    late = FakeSlot("late", log)
    ticket.swap(SlotRole.SERVE, late)  # a retry that raced the request's end
    assert late.released and not ticket.slots
    assert len(forecast) == 0


async def test_a_slot_set_is_held_role_by_role_from_the_start() -> None:
    """A disaggregated dispatch (one `SlotSet`) gives a ticket holding each slot in its own role: nothing
    parks in SERVE, and every slot is released once with the ticket."""
    log: list[str] = []
    prefill, decode = FakeSlot("prefill", log), FakeSlot("decode", log)
    pair = SlotSet({SlotRole.PREFILL: prefill, SlotRole.DECODE: decode})
    ticket, _, _ = await make_ticket(pair, Tenant("t"))
    assert dict(ticket.slots) == {SlotRole.PREFILL: prefill, SlotRole.DECODE: decode}
    assert ticket.slot(SlotRole.SERVE) is None
    ticket.swap(SlotRole.PREFILL, None)  # its leg is done
    await ticket.release()
    assert log == ["prefill", "decode"]
