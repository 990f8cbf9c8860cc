"""The slot credits' link to the lease store: store calls, the credit mode that follows the store's
health, lease renewal and loss.

- Calls run together (`calls`); after each batch the link reads the `StateHealth`: available →
  `CreditMode.SHARED`; unreachable → `LOCAL` under `fail_open` (each instance its own cap), `CLOSED`
  under `fail_closed` (no new dispatch). A change is logged and told to `on_mode_change`; while not
  shared the refiller probes every `PROBE_INTERVAL_S` (`probe_due`, `probe`), and on the way back to
  shared every held lease is due for renewal at once.
- Renewal (`renew`): every held lease is renewed every ttl / `RENEWALS_PER_TTL`; while the health is
  unknown the due ones are tried again at the next probe. A credit whose lease was lost (expired while
  the instance stalled) leaves its replica and is counted in `leases_lost_total`, logged at most once
  per `LOST_LOG_INTERVAL_S`; a lost presence is dropped.
- Releases run together (`release`), or in the background when no one waits for them
  (`spawn_release`; `drain` awaits those).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from admission.leases import Lease, LeaseStore
from core.clock import Clock
from gateway.upstream.slot_credit_ledger import (
    CreditMode,
    HeldCredit,
    PoolCredits,
    ReplicaCredits,
    StateHealth,
)

logger = logging.getLogger(__name__)

RENEWALS_PER_TTL = 3
PROBE_INTERVAL_S = 1.0
LOST_LOG_INTERVAL_S = 30.0

_R = TypeVar("_R")

HeldEntry = tuple[PoolCredits, ReplicaCredits | None, HeldCredit]
"""A held lease with where it lives: its pool, and its replica (None: the pool's presence)."""


class CreditStoreLink:
    """The lease store as the slot credits use it (see the module docstring)."""

    def __init__(
        self,
        store: LeaseStore,
        health: StateHealth,
        clock: Clock,
        *,
        ttl_s: float,
        on_mode_change: Callable[[CreditMode], None],
    ) -> None:
        self.store = store
        self.health = health
        self.clock = clock
        self.ttl_s = ttl_s
        self._on_mode_change = on_mode_change
        self._mode = CreditMode.SHARED
        self.probe_at_s = 0.0
        self._background: set[asyncio.Task[bool]] = set()
        self._last_loss_log_s: float | None = None
        self.leases_lost_total = 0

    @property
    def mode(self) -> CreditMode:
        return self._mode

    def renew_at_s(self, now_s: float) -> float:
        """When a lease renewed (or acquired) at `now_s` is next due."""
        return now_s + self.ttl_s / RENEWALS_PER_TTL

    def probe_due(self) -> bool:
        """Not shared, and the next probe of the store is due."""
        return self._mode is not CreditMode.SHARED and self.clock.now_s() >= self.probe_at_s

    async def probe(self, resource_id: str) -> None:
        """Ask the store something cheap, to learn whether it answers again."""
        self.probe_at_s = self.clock.now_s() + PROBE_INTERVAL_S
        await self.calls([self.store.count(resource_id)])

    async def renew(self, due: list[HeldEntry]) -> None:
        """Renew the due leases; drop the lost ones from their replica or pool."""
        if not due:
            return
        renewed = await self.calls([self.store.renew(held.lease) for _, _, held in due])
        if not self.health.available:  # unknown: try again at the next probe
            for _, _, held in due:
                held.renew_at_s = self.clock.now_s() + PROBE_INTERVAL_S
            return
        for (pc, rc, held), ok in zip(due, renewed, strict=True):
            if ok:
                held.renew_at_s = self.renew_at_s(self.clock.now_s())
                continue
            if rc is None:
                if pc.presence is held:
                    pc.presence = None
                continue
            if held in rc.credits:
                rc.credits.remove(held)
                self._lost(rc)

    async def release(self, held: list[HeldCredit]) -> None:
        if held:
            await self.calls([self.store.release(h.lease) for h in held])

    def spawn_release(self, lease: Lease) -> None:
        task = asyncio.get_running_loop().create_task(self.store.release(lease))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for the background releases."""
        await asyncio.gather(*self._background, return_exceptions=True)

    async def calls(self, calls: list[Awaitable[_R]]) -> list[_R]:
        """Run store calls together, then follow the store's health (mode changes)."""
        results = list(await asyncio.gather(*calls))
        self._observe()
        return results

    def _observe(self) -> None:
        if self.health.available:
            mode = CreditMode.SHARED
        else:
            mode = CreditMode.LOCAL if self.health.fail_open else CreditMode.CLOSED
        if mode is self._mode:
            return
        before, self._mode = self._mode, mode
        if mode is CreditMode.SHARED:
            logger.warning("replica slot credits: shared state answers again; caps hold across instances")
        else:
            self.probe_at_s = self.clock.now_s() + PROBE_INTERVAL_S
            logger.warning(
                "replica slot credits: shared state unreachable (was %s); %s",
                before,
                "each instance applies its own cap" if mode is CreditMode.LOCAL else "no new dispatch",
            )
        self._on_mode_change(mode)

    def _lost(self, rc: ReplicaCredits) -> None:
        self.leases_lost_total += 1
        now_s = self.clock.now_s()
        if self._last_loss_log_s is None or now_s - self._last_loss_log_s >= LOST_LOG_INTERVAL_S:
            self._last_loss_log_s = now_s
            logger.warning(
                "replica %s: a slot credit expired before its renewal (%d lost so far)",
                rc.resource_id,
                self.leases_lost_total,
            )
