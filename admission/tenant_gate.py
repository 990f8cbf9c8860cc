"""The tenant stage of admission: rate limits, then the bulkhead — and giving both back.

One `TenantGate` is shared by every pool's controller (tenant limits are per tenant, not per model),
with either memory stores (`TenantGate.in_memory`) or the Redis ones (`RedisRateLimitStore`,
`RedisLeaseStore(..., LeaseScope.TENANT)`) so limits hold across gateway instances.

`enter(tenant, estimated_tokens)` → a `TenantPass`, or `AdmissionRefused(RATE_LIMITED)`:
1. rate limit — `RateLimitStore.acquire(tenant.name, tenant.rate_limits, estimated_tokens)`, skipped
   when the tenant has no per-minute limits. Refused → Retry-After = the bucket's refill time
   (`rate_limit_retry_after_s`), `limited_by` = `requests` | `tokens`. When the store refused because
   Redis is unreachable and `fail_closed`, the refusal is `state_unavailable` (503) instead: the limits
   could not be checked; Retry-After is then the outage's age.
2. bulkhead — a tenant-scope lease with cap `max_concurrent` and ttl `lease_ttl_s` (default 30 s),
   skipped when unset. Refused → also 429 `rate_limited` (the error contract's reason for "tenant over
   its limits"; no new reason), `limited_by="concurrency"`, Retry-After = expected time until the first
   of the tenant's `max_concurrent` requests ends: mean service time ÷ max_concurrent
   (`concurrency_retry_after_s`). The tokens charged in step 1 are refunded.

With `entry` (Redis state), a tenant with both per-minute limits and `max_concurrent` takes both steps in
one atomic script (`admission.redis_tenant_entry`): one round trip instead of two, the same outcomes.

Mean service time (dispatch → ticket release) is an EWMA, `mean_s += 0.1 · (sample_s − mean_s)`, starting from
`initial_service_s` (default 5 s, about the W ≈ 4.5 s of DESIGN §7) until requests have been measured.

Giving back:
- `leave(pass, service_s)` after an admitted request (via `Ticket.release`): idempotent; stops the lease
  renewal, releases the lease (shielded: a cancelled caller cannot leak it), records the service time.
- `abandon(pass)` when the request was refused or cancelled after `enter`: refunds the charged tokens
  and releases the lease in a background task (so refusals stay fast and cancellation is never
  delayed). The request-count token is not refunded: an attempt counts as a request.
- `reconcile(pass, actual_tokens)`: charges `actual − charged` once (negative refunds), where
  `charged = min(estimate, bucket capacity)` is what the bucket really took (0 when fail-open
  admitted without Redis).
A held lease is renewed every `ttl / 3` by a timer; a renewal that finds the lease gone (expired during
a Redis outage) stops renewing, counts `leases_lost_total` and logs at most once per 30 s. A lease
whose `acquire` was cancelled mid-call (Redis) is never seen and expires after its ttl; likewise a
rate-limit charge whose `acquire` was cancelled mid-call is not refunded (the bucket refills anyway).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from admission.leases import Lease, LeaseScope, LeaseStore, MemoryLeaseStore
from admission.outcomes import AdmissionRefused, RejectReason
from admission.rate_limit import MemoryRateLimitStore, RateLimitResult, RateLimitStore, TenantRateLimits
from admission.retry_after import (
    DEFAULT_MAX_RETRY_AFTER_S,
    concurrency_retry_after_s,
    rate_limit_retry_after_s,
)
from admission.tenants import Tenant
from admission.timers import LoopTimers, TimerHandle, Timers
from core.clock import Clock

logger = logging.getLogger(__name__)

CONCURRENCY_LIMIT = "concurrency"
DEFAULT_TENANT_LEASE_TTL_S = 30.0
DEFAULT_INITIAL_SERVICE_S = 5.0
SERVICE_EWMA_ALPHA = 0.1
RENEWALS_PER_TTL = 3
LOST_LEASE_LOG_INTERVAL_S = 30.0


class TenantEntry(Protocol):
    """Both steps of `enter` in one atomic call on the shared state (`admission.redis_tenant_entry`)."""

    async def enter(
        self, tenant: str, limits: TenantRateLimits, estimated_tokens: int, cap: int, ttl_s: float
    ) -> tuple[RateLimitResult, Lease | None]:
        """The rate-limit decision and, when it allowed, a lease (None at the cap)."""
        ...


@dataclass(eq=False, slots=True)
class TenantPass:
    """What `enter` took for one request: tokens charged to the bucket, the bulkhead lease."""

    tenant: Tenant
    charged_tokens: float
    rate_limit: RateLimitResult | None
    lease: Lease | None
    renewal: TimerHandle | None = None
    closed: bool = False
    reconciled: bool = False


class TenantGate:
    """Rate limits and bulkheads of all tenants (see the module docstring)."""

    def __init__(
        self,
        rate_limits: RateLimitStore,
        tenant_leases: LeaseStore,
        clock: Clock,
        *,
        timers: Timers | None = None,
        lease_ttl_s: float = DEFAULT_TENANT_LEASE_TTL_S,
        initial_service_s: float = DEFAULT_INITIAL_SERVICE_S,
        max_retry_after_s: int = DEFAULT_MAX_RETRY_AFTER_S,
        entry: TenantEntry | None = None,
    ) -> None:
        if tenant_leases.scope is not LeaseScope.TENANT:
            raise ValueError(f"the bulkhead needs a tenant-scope lease store (got {tenant_leases.scope})")
        if lease_ttl_s <= 0 or initial_service_s <= 0:
            raise ValueError("lease_ttl_s and initial_service_s must be > 0")
        self._rate_limits = rate_limits
        self._leases = tenant_leases
        self._entry = entry
        self._clock = clock
        self._timers: Timers = timers or LoopTimers(clock)
        self._lease_ttl_s = lease_ttl_s
        self._max_retry_after_s = max_retry_after_s
        self._mean_service_s = initial_service_s
        self._background: set[asyncio.Task[Any]] = set()
        self._last_loss_log_s: float | None = None
        self.leases_lost_total = 0

    @classmethod
    def in_memory(cls, clock: Clock, timers: Timers | None = None, **kwargs: Any) -> TenantGate:
        """A gate on memory stores (one gateway instance)."""
        leases = MemoryLeaseStore(clock, LeaseScope.TENANT)
        return cls(MemoryRateLimitStore(clock), leases, clock, timers=timers, **kwargs)

    @property
    def mean_service_s(self) -> float:
        """Current estimate of a request's service time (dispatch → ticket release)."""
        return self._mean_service_s

    @property
    def tenant_leases(self) -> LeaseStore:
        """The bulkhead store (e.g. to read `count(tenant)` for an admin view)."""
        return self._leases

    async def enter(self, tenant: Tenant, estimated_tokens: int, priority: str | None = None) -> TenantPass:
        """Apply the tenant's rate limits then its bulkhead; AdmissionRefused(RATE_LIMITED) on refusal."""
        limits = tenant.rate_limits
        limited = limits.requests is not None or limits.tokens is not None
        if self._entry is not None and limited and tenant.max_concurrent is not None:
            return await self._enter_at_once(self._entry, tenant, estimated_tokens, priority)
        result: RateLimitResult | None = None
        charged_tokens = 0.0
        if limited:
            result = await self._rate_limits.acquire(tenant.name, limits, estimated_tokens)
            if not result.allowed:
                raise _rate_limited(tenant, result, priority, self._max_retry_after_s)
            if limits.tokens is not None and not result.degraded:
                charged_tokens = min(float(max(estimated_tokens, 0)), limits.tokens.capacity)
        pass_ = TenantPass(tenant, charged_tokens, result, lease=None)
        if tenant.max_concurrent is None:
            return pass_
        try:
            pass_.lease = await self._leases.acquire(tenant.name, tenant.max_concurrent, self._lease_ttl_s)
        finally:
            if pass_.lease is None:  # refused, or cancelled / failed mid-call
                self.abandon(pass_)
        if pass_.lease is None:
            raise self._bulkhead_refused(tenant, priority)
        self._schedule_renewal(pass_)
        return pass_

    async def _enter_at_once(
        self, entry: TenantEntry, tenant: Tenant, estimated_tokens: int, priority: str | None
    ) -> TenantPass:
        """`enter` in one call to the shared state (`TenantEntry`): nothing to undo on a refusal."""
        assert tenant.max_concurrent is not None
        limits = tenant.rate_limits
        result, lease = await entry.enter(
            tenant.name, limits, estimated_tokens, tenant.max_concurrent, self._lease_ttl_s
        )
        if not result.allowed:
            raise _rate_limited(tenant, result, priority, self._max_retry_after_s)
        if lease is None:
            raise self._bulkhead_refused(tenant, priority)
        charged_tokens = 0.0
        if limits.tokens is not None and not result.degraded:
            charged_tokens = min(float(max(estimated_tokens, 0)), limits.tokens.capacity)
        pass_ = TenantPass(tenant, charged_tokens, result, lease)
        self._schedule_renewal(pass_)
        return pass_

    def _bulkhead_refused(self, tenant: Tenant, priority: str | None) -> AdmissionRefused:
        cap = tenant.max_concurrent or 0
        return AdmissionRefused(
            RejectReason.RATE_LIMITED,
            concurrency_retry_after_s(cap, self._mean_service_s, self._max_retry_after_s),
            f"tenant {tenant.name!r} already has {cap} concurrent requests",
            priority=priority,
            limited_by=CONCURRENCY_LIMIT,
        )

    async def leave(self, pass_: TenantPass, service_s: float) -> None:
        """Give back an admitted request's lease and record its service time. Idempotent."""
        if pass_.closed:
            return
        self._close(pass_)
        self._mean_service_s += SERVICE_EWMA_ALPHA * (max(service_s, 0.0) - self._mean_service_s)
        if pass_.lease is not None:
            await asyncio.shield(self._spawn(self._leases.release(pass_.lease)))

    def abandon(self, pass_: TenantPass) -> None:
        """Undo `enter` for a request that will not run: refund tokens, release the lease (background)."""
        if pass_.closed:
            return
        self._close(pass_)
        if pass_.charged_tokens > 0 or pass_.lease is not None:
            self._spawn(self._undo(pass_))

    async def reconcile(self, pass_: TenantPass, actual_tokens: int) -> None:
        """Charge `actual_tokens − charged` to the token bucket, once; later calls do nothing."""
        limits = pass_.tenant.rate_limits
        if pass_.reconciled or limits.tokens is None:
            return
        pass_.reconciled = True
        delta_tokens = round(max(actual_tokens, 0) - pass_.charged_tokens)
        await self._rate_limits.reconcile(pass_.tenant.name, limits, delta_tokens)

    async def flush(self) -> None:
        """Wait for every background refund, release and renewal started so far (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def _close(self, pass_: TenantPass) -> None:
        pass_.closed = True
        if pass_.renewal is not None:
            pass_.renewal.cancel()
            pass_.renewal = None

    async def _undo(self, pass_: TenantPass) -> None:
        limits = pass_.tenant.rate_limits
        if pass_.charged_tokens > 0 and limits.tokens is not None:
            await self._rate_limits.reconcile(pass_.tenant.name, limits, -round(pass_.charged_tokens))
        if pass_.lease is not None:
            await self._leases.release(pass_.lease)

    def _schedule_renewal(self, pass_: TenantPass) -> None:
        assert pass_.lease is not None
        when_s = self._clock.now_s() + pass_.lease.ttl_s / RENEWALS_PER_TTL
        pass_.renewal = self._timers.call_at(when_s, lambda: self._on_renewal_due(pass_))

    def _on_renewal_due(self, pass_: TenantPass) -> None:
        pass_.renewal = None
        if not pass_.closed:
            self._spawn(self._renew(pass_))

    async def _renew(self, pass_: TenantPass) -> None:
        if pass_.closed or pass_.lease is None:
            return
        if await self._leases.renew(pass_.lease):
            if not pass_.closed:
                self._schedule_renewal(pass_)
            return
        self.leases_lost_total += 1
        now_s = self._clock.now_s()
        if self._last_loss_log_s is None or now_s - self._last_loss_log_s >= LOST_LEASE_LOG_INTERVAL_S:
            self._last_loss_log_s = now_s
            logger.warning(
                "tenant %r lost a bulkhead lease while its request runs (%d lost so far)",
                pass_.tenant.name,
                self.leases_lost_total,
            )

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("admission background task failed", exc_info=exc)


def _rate_limited(
    tenant: Tenant, result: RateLimitResult, priority: str | None, max_retry_after_s: int
) -> AdmissionRefused:
    limited_by = result.limited_by
    if result.degraded:  # Redis unreachable with fail_closed: the limits cannot be checked, not exceeded
        return AdmissionRefused(
            RejectReason.STATE_UNAVAILABLE,
            rate_limit_retry_after_s(result.retry_after_s, max_retry_after_s),
            f"tenant {tenant.name!r}: its rate limits live in shared state, which is unreachable "
            "(state.on_error: fail_closed)",
            priority=priority,
        )
    what = f"{limited_by} per minute" if limited_by is not None else "rate-limit state unavailable"
    return AdmissionRefused(
        RejectReason.RATE_LIMITED,
        rate_limit_retry_after_s(result.retry_after_s, max_retry_after_s),
        f"tenant {tenant.name!r} is over its rate limit ({what})",
        priority=priority,
        limited_by=None if limited_by is None else str(limited_by),
    )
