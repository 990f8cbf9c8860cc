"""Slot leases: a capped number of concurrent holders per resource, each lease expiring unless renewed.

One primitive serves two caps:
- `LeaseScope.REPLICA`: per-replica concurrency (`max_concurrency_per_replica`, B_max), so the cap holds
  across gateway instances when the store is Redis; the resource is a pool's replica
  (`{model}@{host}:{port}`), so pools naming the same engine address keep separate caps;
- `LeaseScope.TENANT`: the tenant bulkhead (max concurrent requests of a tenant).

Protocol (same in memory and Redis, `admission.redis_leases`):
- `acquire(resource_id, cap, ttl_s)` → a `Lease`, or None when `cap` unexpired leases exist; expired
  leases are pruned first, so a lease whose holder died is reclaimed at most `ttl_s` after its last renewal;
- `renew(lease)` → True when it was still held (expiry pushed to now + ttl); False when it had expired or
  was released (the slot may already belong to someone else; the request keeps running, the gateway logs);
- `release(lease)` → True when it was held; call it on every path (`finally`);
- `count(resource_id)` → unexpired leases.
A holder renews every `ttl_s / 3` or so while its request runs. A lease is expired when `now ≥ expiry`.

`Lease.degraded` marks a lease granted by `FailureMode.FAIL_OPEN` while Redis was unreachable: renewing
and releasing it are local no-ops that return True.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from core.clock import Clock


class LeaseScope(StrEnum):
    """What a lease caps (part of the storage key and a metric label)."""

    REPLICA = "replica"
    TENANT = "tenant"


@dataclass(frozen=True, slots=True)
class Lease:
    """A held slot: `resource_id` (a pool's replica or a tenant), a unique `lease_id`, its renewal ttl."""

    scope: LeaseScope
    resource_id: str
    lease_id: str
    ttl_s: float
    degraded: bool = False


def random_lease_id() -> str:
    """128 random bits as hex: unique across gateway instances without coordination."""
    return secrets.token_hex(16)


def validate_lease_args(cap: int, ttl_s: float) -> None:
    """ValueError unless `cap ≥ 0` and `ttl_s > 0`."""
    if cap < 0:
        raise ValueError(f"cap must be ≥ 0 (got {cap})")
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be > 0 (got {ttl_s})")


class LeaseStore(Protocol):
    """Capped, expiring slot leases for one `LeaseScope`."""

    @property
    def scope(self) -> LeaseScope:
        """Which cap this store enforces."""
        ...

    async def acquire(self, resource_id: str, cap: int, ttl_s: float) -> Lease | None:
        """A lease when fewer than `cap` unexpired leases exist on `resource_id`, else None."""
        ...

    async def renew(self, lease: Lease) -> bool:
        """Push the lease's expiry to now + `lease.ttl_s`; False when it was no longer held."""
        ...

    async def release(self, lease: Lease) -> bool:
        """Give the slot back; False when it was no longer held."""
        ...

    async def count(self, resource_id: str) -> int:
        """Unexpired leases on `resource_id`."""
        ...


class MemoryLeaseStore:
    """Leases in a dict on an injected clock (one process). Each call is atomic: it never awaits."""

    def __init__(
        self, clock: Clock, scope: LeaseScope, id_factory: Callable[[], str] = random_lease_id
    ) -> None:
        self._clock = clock
        self._scope = scope
        self._id_factory = id_factory
        self._expiry_s: dict[str, dict[str, float]] = {}

    @property
    def scope(self) -> LeaseScope:
        """Which cap this store enforces."""
        return self._scope

    async def acquire(self, resource_id: str, cap: int, ttl_s: float) -> Lease | None:
        """See `LeaseStore.acquire`: prune expired, check the count, add."""
        validate_lease_args(cap, ttl_s)
        now_s = self._clock.now_s()
        held = self._pruned(resource_id, now_s)
        if len(held) >= cap:
            return None
        lease = Lease(self._scope, resource_id, self._id_factory(), ttl_s)
        self._expiry_s.setdefault(resource_id, {})[lease.lease_id] = now_s + ttl_s
        return lease

    async def renew(self, lease: Lease) -> bool:
        """See `LeaseStore.renew`."""
        if lease.degraded:
            return True
        now_s = self._clock.now_s()
        held = self._pruned(lease.resource_id, now_s)
        if lease.lease_id not in held:
            return False
        held[lease.lease_id] = now_s + lease.ttl_s
        return True

    async def release(self, lease: Lease) -> bool:
        """See `LeaseStore.release`."""
        if lease.degraded:
            return True
        held = self._pruned(lease.resource_id, self._clock.now_s())
        found = held.pop(lease.lease_id, None) is not None
        if not held:
            self._expiry_s.pop(lease.resource_id, None)
        return found

    async def count(self, resource_id: str) -> int:
        """See `LeaseStore.count`."""
        return len(self._pruned(resource_id, self._clock.now_s()))

    def _pruned(self, resource_id: str, now_s: float) -> dict[str, float]:
        held = self._expiry_s.get(resource_id, {})
        for lease_id in [lid for lid, expiry_s in held.items() if expiry_s <= now_s]:
            del held[lease_id]
        return held
