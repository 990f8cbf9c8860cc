"""A fake fleet with N slots, a controller on a FakeClock with ManualTimers, and request helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from admission.config import AdmissionConfig
from admission.controller import AdmissionController
from admission.observer import AdmissionObserver
from admission.priority_classes import DEFAULT_PRIORITY_CLASSES, PriorityClass
from admission.tenant_gate import TenantGate
from admission.tenants import Tenant
from admission.ticket import AdmissionRequest
from admission.timers import ManualTimers
from core.clock import FakeClock
from router.types import RoutingRequest

DEFAULT_TENANT = Tenant("t")


class Slot:
    """A dispatch token: one slot of the fake fleet; releasing it wakes the controller."""

    def __init__(self, fleet: FakeFleet, label: str) -> None:
        self.fleet = fleet
        self.label = label
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.fleet.in_use -= 1
        if self.fleet.controller is not None:
            self.fleet.controller.on_release()


@dataclass
class FakeFleet:
    """`try_dispatch` for tests: a slot while fewer than `slots` are in use; records every call."""

    slots: int
    in_use: int = 0
    headroom: int = 0
    """Slots above `slots` that only `try_at_deadline` may take (a learned cap's headroom)."""
    asked: list[str] = field(default_factory=list)
    dispatched: list[str] = field(default_factory=list)
    controller: AdmissionController[Slot] | None = None

    def try_dispatch(self, request: AdmissionRequest) -> Slot | None:
        label = label_of(request)
        self.asked.append(label)
        if self.in_use >= self.slots:
            return None
        self.in_use += 1
        self.dispatched.append(label)
        return Slot(self, label)

    def try_at_deadline(self, request: AdmissionRequest) -> Slot | None:
        label = label_of(request)
        self.asked.append(f"deadline:{label}")
        if self.in_use >= self.slots + self.headroom:
            return None
        self.in_use += 1
        self.dispatched.append(label)
        return Slot(self, label)


@dataclass
class Harness:
    clock: FakeClock
    timers: ManualTimers
    fleet: FakeFleet
    gate: TenantGate
    controller: AdmissionController[Slot]


def make_harness(
    slots: int = 1,
    max_depth: int = 100,
    classes: Sequence[PriorityClass] = DEFAULT_PRIORITY_CLASSES,
    lease_ttl_s: float = 30.0,
    *,
    early_refusal_ratio: float | None = None,
    early_refusal_needs_queue: bool = False,
    output_tokens: Callable[[AdmissionRequest], int | None] | None = None,
    seconds_per_token: Callable[[], float | None] | None = None,
    slots_over_caps: Callable[[AdmissionRequest], int] | None = None,
    headroom: int | None = None,
    retry_lane_share: float = 0.0,
    observer: AdmissionObserver | None = None,
) -> Harness:
    clock = FakeClock(start_s=1000.0)
    timers = ManualTimers(clock)
    fleet = FakeFleet(slots, headroom=headroom or 0)
    gate = TenantGate.in_memory(clock, timers, lease_ttl_s=lease_ttl_s)
    config = AdmissionConfig(
        classes=tuple(classes),
        max_queue_depth=max_depth,
        early_refusal_ratio=early_refusal_ratio,
        early_refusal_needs_queue=early_refusal_needs_queue,
        retry_lane_share=retry_lane_share,
    )
    controller = AdmissionController(
        fleet.try_dispatch,
        gate,
        clock=clock,
        config=config,
        timers=timers,
        observer=observer,
        output_tokens=output_tokens,
        seconds_per_token=seconds_per_token,
        slots_over_caps=slots_over_caps,
        try_at_deadline=None if headroom is None else fleet.try_at_deadline,
    )
    fleet.controller = controller
    return Harness(clock, timers, fleet, gate, controller)


def req(
    label: str, priority: str = "interactive", tokens: int = 100, tenant: Tenant = DEFAULT_TENANT
) -> AdmissionRequest:
    """A request whose label travels in `routing.prompt_text` (what try_dispatch would route on)."""
    return AdmissionRequest(tenant, priority, tokens, RoutingRequest(model="m", prompt_text=label))


def label_of(request: AdmissionRequest) -> str:
    assert request.routing is not None
    return request.routing.prompt_text


async def run_scheduled_pump() -> None:
    """One loop iteration: the pump a release scheduled (`call_soon`) runs and dispatches; the tasks it
    wakes have not resumed yet (their wake-ups are queued behind this one)."""
    await asyncio.sleep(0)


async def settle(rounds: int = 10) -> None:
    """Let every ready task run (no time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
