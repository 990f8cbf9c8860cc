"""The values exchanged with `AdmissionController`: what is asked (`AdmissionRequest`) and what is
given (`Grant`), plus the one thing admission needs from a dispatch token (`DispatchToken`).

A dispatch token is whatever the gateway's `try_dispatch` returns when a replica has a free slot —
e.g. its in-flight guard wrapped with the routing decision. The token must already hold the slot when
`try_dispatch` returns (admission is synchronous between deciding and claiming), and its `release()`
must be idempotent: the controller releases a token itself when a waiter is cancelled in the instant
between being dispatched and resuming, and `Grant.release()` releases it on every path.

`Grant.release()` is the one release of everything admission gave: the token (synchronously, first,
after telling the controller's `ReleaseForecast` that the slot held since dispatch is free), then the
tenant's bulkhead lease; idempotent, for the caller's `finally`. `Grant.reconcile(actual)`
corrects the token bucket once the actual usage is known (once; later calls do nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from admission.rate_limit import RateLimitResult
from admission.release_forecast import ReleaseForecast
from admission.tenant_gate import TenantGate, TenantPass
from admission.tenants import Tenant
from core.clock import Clock
from router.types import RoutingRequest


class DispatchToken(Protocol):
    """A claimed replica slot; `release()` frees it (idempotent, synchronous)."""

    def release(self) -> None:
        """Free the slot; a no-op when already released."""
        ...


T = TypeVar("T", bound=DispatchToken)


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """One request asking for admission.

    `priority` must be one of the controller's classes (resolve it with
    `TenantDirectory.resolve_priority`); `estimated_tokens` = prompt tokens + max_tokens (what the
    token bucket is charged and the fair-share cost); `routing` is carried for `try_dispatch` to route
    with (admission never reads it). `weight` is the tenant's fair-share weight.
    """

    tenant: Tenant
    priority: str
    estimated_tokens: int = 0
    routing: RoutingRequest | None = None

    @property
    def weight(self) -> float:
        """The tenant's weight in weighted fair queuing within the class."""
        return self.tenant.weight


class Grant(Generic[T]):
    """An admitted request: its dispatch `token`, the time it waited, and its release path."""

    __slots__ = (
        "_clock",
        "_forecast",
        "_gate",
        "_hold_key",
        "_pass",
        "_released",
        "dispatched_at_s",
        "queue_wait_s",
        "request",
        "token",
    )

    def __init__(
        self,
        token: T,
        request: AdmissionRequest,
        *,
        queue_wait_s: float,
        gate: TenantGate,
        tenant_pass: TenantPass,
        clock: Clock,
        forecast: ReleaseForecast | None = None,
        hold_key: int | None = None,
    ) -> None:
        self.token = token
        self.request = request
        self.queue_wait_s = queue_wait_s
        self.dispatched_at_s = clock.now_s()
        self._gate = gate
        self._pass = tenant_pass
        self._clock = clock
        self._released = False
        self._forecast = forecast  # the controller's; `hold_key` was registered in it at dispatch
        self._hold_key = hold_key

    @property
    def queue_wait_ms(self) -> float:
        """Queue wait in milliseconds (`x-gateway-queue-ms`, `Server-Timing: queue;dur=`)."""
        return self.queue_wait_s * 1000.0

    @property
    def rate_limit(self) -> RateLimitResult | None:
        """The allowed rate-limit decision (remaining quota, reset), None when the tenant is unlimited."""
        return self._pass.rate_limit

    @property
    def released(self) -> bool:
        """True once `release()` was called."""
        return self._released

    async def release(self) -> None:
        """Release the token, then the tenant's bulkhead lease. Idempotent; call it in `finally`."""
        if self._released:
            return
        self._released = True
        if self._forecast is not None and self._hold_key is not None:
            self._forecast.release(self._hold_key)
        try:
            self.token.release()
        finally:
            await self._gate.leave(self._pass, self._clock.now_s() - self.dispatched_at_s)

    async def reconcile(self, actual_tokens: int) -> None:
        """Charge the tenant's token bucket with the actual usage instead of the estimate (once)."""
        await self._gate.reconcile(self._pass, actual_tokens)
