"""The state a fleet's gateway instances share, and what lives on it, built from the `state:` settings.

- `state_backend`: the Redis backend with the configured failure mode, or None with memory state
  (each instance alone). Every call that cannot reach Redis is counted as
  `llm_gateway_state_errors_total{operation}`; a `state.timeout_s` under which a renewal period does
  not fit is logged as a warning at start-up.
- `tenant_gate`: the tenant gate (rate limits and bulkheads) on memory stores, or on Redis ones behind
  atomic scripts.
- `slot_credits`: the replica slot credits on Redis (None with memory state: each instance's own cap is
  the cap);
- `share_prefix_indexes`: with Redis state and `state.share_prefix_index`, the exchange of the prefix
  indexes of every pool whose policy keeps one (`gateway.fleet.prefix_sharing`);
- `share_lowest_class_counts`: with Redis state and several priority classes, the exchange of each
  replica's lowest-class request count in the pools that learn a cap (`gateway.fleet.lowest_class_sharing`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Protocol

from admission.leases import LeaseScope
from admission.redis_leases import RedisLeaseStore
from admission.redis_rate_limit import RedisRateLimitStore
from admission.redis_tenant_entry import RedisTenantEntry
from admission.tenant_gate import TenantGate
from core.clock import Clock
from core.shared_state import RedisBackend, outlasted_periods
from core.state_outage import FailureMode, RedisOperation
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import Settings
from gateway.fleet.instance_membership import new_instance_id
from gateway.fleet.lowest_class_sharing import LowestClassSharing
from gateway.fleet.prefix_sharing import PrefixIndexSharing, SharingMetrics
from gateway.upstream.registry import Pool
from gateway.upstream.slot_credits import SlotCredits
from router.prefix_index import policy_prefix_index

logger = logging.getLogger(__name__)


class SharedPool(Protocol):
    """What sharing needs of a pool (`gateway.upstream.registry.Pool` fits)."""

    @property
    def policy(self) -> object: ...

    @property
    def replicas(self) -> Mapping[str, Any]: ...


def state_backend(settings: Settings, metrics: GatewayMetrics) -> RedisBackend | None:
    """The Redis backend with the configured failure mode, None with memory state. Every call that
    cannot reach Redis is counted as `llm_gateway_state_errors_total{operation}`."""
    state = settings.state
    if state.backend == "memory":
        return None

    def count_error(operation: RedisOperation) -> None:
        metrics.state_errors_total.labels(str(operation)).inc()

    renewals_s = {
        "state.replica_lease_ttl_s / 3": state.replica_lease_ttl_s / 3,
        "idempotency.lease_s / 3": settings.idempotency.lease_s / 3,
    }
    for period in outlasted_periods(state.timeout_s, renewals_s):
        logger.warning(
            "state.timeout_s %g s: a Redis call may take 4 x that before it fails, not under %s "
            "(%g s), the renewal period; a slow Redis delays renewals, and a held slot credit or "
            "claim lapses once they fall 2 periods behind",
            state.timeout_s,
            period,
            renewals_s[period],
        )

    return RedisBackend.from_url(
        state.url,
        on_error=FailureMode(state.on_error),
        key_prefix=state.key_prefix,
        timeout_s=state.timeout_s,
        on_error_callback=count_error,
    )


def tenant_gate(backend: RedisBackend | None, clock: Clock) -> TenantGate:
    """Memory stores, or Redis ones behind atomic scripts with the configured failure mode (a tenant's
    rate limits and bulkhead taken in one script: `admission.redis_tenant_entry`)."""
    if backend is None:
        return TenantGate.in_memory(clock)
    leases = RedisLeaseStore(backend, LeaseScope.TENANT)
    rate_limits = RedisRateLimitStore(backend)
    entry = RedisTenantEntry(backend, rate_limits, leases)
    return TenantGate(rate_limits, leases, clock, entry=entry)


def slot_credits(
    backend: RedisBackend | None, settings: Settings, clock: Clock, metrics: GatewayMetrics
) -> SlotCredits | None:
    """Replica slot credits on Redis (None with memory state: each instance's own cap is the cap).
    A failure of the refiller loop itself is logged with its stack trace and counted as
    `llm_gateway_state_errors_total{operation="slot_credit_refill"}`."""
    if backend is None:
        return None
    state = settings.state
    return SlotCredits(
        RedisLeaseStore(backend, LeaseScope.REPLICA),
        backend,
        clock,
        ttl_s=state.replica_lease_ttl_s,
        linger_s=state.replica_credit_linger_s,
        on_error=metrics.state_errors_total.labels("slot_credit_refill").inc,
    )


def share_prefix_indexes(
    backend: RedisBackend | None, enabled: bool, pools: Mapping[str, SharedPool], metrics: GatewayMetrics
) -> Callable[[], Awaitable[None]]:
    """Start sharing the index of every pool whose policy keeps one, with Redis state and `enabled`;
    returns the closer to register (a no-op when nothing is shared)."""
    found = {name: policy_prefix_index(pool.policy) for name, pool in pools.items()}
    indexes = {name: index for name, index in found.items() if index is not None}
    if backend is None or not enabled or not indexes:
        return _nothing_to_close

    def members(name: str) -> Collection[str]:
        return pools[name].replicas.keys()

    sharing = PrefixIndexSharing(backend, indexes, members, SharingMetrics(metrics))
    sharing.start()
    return sharing.stop


def share_lowest_class_counts(
    backend: RedisBackend | None,
    settings: Settings,
    pools: Mapping[str, Pool],
    metrics: GatewayMetrics,
    on_more: Callable[[], None],
) -> Callable[[], Awaitable[None]]:
    """Start exchanging each replica's lowest-class count with Redis state and several priority
    classes, for the pools that learn a cap (no other pool lends a place: `PoolSettings.learns_cap`);
    `on_more()` when the others' count on a replica grew (the top class's waiters may fit). Returns
    the closer to register (a no-op when nothing is exchanged)."""
    capped = {name: pool for name, pool in pools.items() if pool.settings.learns_cap}
    if backend is None or len(settings.admission.classes) < 2 or not capped:
        return _nothing_to_close
    sharing = LowestClassSharing(
        backend,
        capped,
        new_instance_id(),
        on_more=on_more,
        on_loop_error=metrics.state_errors_total.labels("lowest_class_sync_loop").inc,
    )
    sharing.start()
    return sharing.stop


async def _nothing_to_close() -> None:
    return None
