"""Slot credits: the per-replica concurrency cap held across gateway instances (`state.backend: redis`).

A credit is a replica slot lease (`admission.leases`, `LeaseScope.REPLICA`, resource =
`{model}@{host}:{port}`, cap = the pool's `max_concurrency_per_replica`) that this instance acquired
ahead of use: the cap is per pool and replica, so pools naming the same engine address do not share it
(`gateway.upstream.slot_credit_ledger`). Dispatch stays synchronous: `Replica.credit_limit` lowers the
cap in the replica's view to what this instance may use now, so `router.eligibility` — the one
definition — sees a replica as eligible only while this instance has a usable credit on it that no
request occupies. Credits are not bound to requests: every in-flight request on a capped replica
occupies one, so held credits bound this instance's in-flight requests, and the lease cap in Redis
bounds the sum over instances.

The limit on a replica (`ReplicaCredits.limit`):
- uncontended: the credits held;
- contended (another instance is starving, see below): the `share = cap // instances wanting` oldest
  credits, plus at most one younger "floating" credit (the remainder of the division) for one linger
  after its acquisition. Credits above that are not reused once they free up but given back (and
  this instance waits `SHED_HOLDOFF_S` before asking for a floating credit on that replica again);
  an instance below its share backs off less when refused, so the one with the fewest credits is the
  likeliest to get the next. Instances converge to equal shares and the remainder rotates;
- Redis unreachable: `fail_open` → the configured cap (each instance alone, as with memory state);
  `fail_closed` → 0 (no new dispatch; requests wait in the queue until Redis answers or their class's
  max wait passes).

The refiller (`step`, run by one background task started on first use, woken by claims and releases):
- renews every held lease (and the presence below) every ttl / 3; a lease that was lost (expired while
  the instance stalled) is dropped and counted (`gateway.upstream.slot_credit_store_link`);
- acquires credits while the pool has queued waiters — its own queue's and those of any queue that
  `add_demand` added (a disaggregated pool's pair queue) — (at most one per replica per round, fewest held
  first, up to the number of waiters) and one spare per eligible replica while the pool is active
  (dispatch within the linger), so routing keeps its choice of replicas; each credit that arrives
  calls the pool's `on_credit` (the admission controller's `on_release`). A replica that refused is
  asked again after an exponential backoff (`ACQUIRE_RETRY_INITIAL_S` … `ACQUIRE_RETRY_MAX_S`);
- starving (waiters, and a replica refused for lack of room): registers a presence lease
  `pool-demand/{model}`, renewed while it has waiters and returned after a linger without. Every
  instance holding credits counts the presences every `CONTENTION_REFRESH_S` to learn its share
  (`gateway.upstream.slot_credit_contention`);
- gives back at once the credits above the limit, and at the end of each linger window the free
  credits above the window's peak in-flight count and the spare (all free ones once no request was
  dispatched for a linger): no instance hoards.
Leases of an instance that died without releasing expire after `state.replica_lease_ttl_s`. While
Redis is unreachable the refiller only renews and probes every `PROBE_INTERVAL_S`; it switches back
by itself. Redis errors are counted and logged by the `RedisBackend` (`state_errors_total`); mode
changes and lost leases by the store link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator

from admission.leases import Lease, LeaseStore
from core.clock import Clock
from core.tasks import cancel_and_wait
from gateway.upstream.registry import Pool
from gateway.upstream.replica import Replica
from gateway.upstream.slot_credit_contention import CONTENTION_REFRESH_S, refresh_contention, update_presence
from gateway.upstream.slot_credit_ledger import (
    SHED_HOLDOFF_S,
    CreditMode,
    HeldCredit,
    PoolCredits,
    ReplicaCredits,
    StateHealth,
)
from gateway.upstream.slot_credit_store_link import PROBE_INTERVAL_S, CreditStoreLink, HeldEntry

logger = logging.getLogger(__name__)

MIN_TICK_S = 0.005
CLOSE_TIMEOUT_S = 2.0


class SlotCredits:
    """Credits of every pool of one gateway instance (see the module docstring)."""

    def __init__(
        self,
        store: LeaseStore,
        health: StateHealth,
        clock: Clock,
        *,
        ttl_s: float,
        linger_s: float,
        autostart: bool = True,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        if ttl_s <= 0 or linger_s <= 0:
            raise ValueError("ttl_s and linger_s must be > 0")
        self.store = store
        self.health = health
        self.clock = clock
        self._on_error = on_error
        self.ttl_s = ttl_s
        self.linger_s = linger_s
        self._autostart = autostart
        self._pools: dict[str, PoolCredits] = {}
        self.link = CreditStoreLink(store, health, clock, ttl_s=ttl_s, on_mode_change=self._mode_changed)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def mode(self) -> CreditMode:
        return self.link.mode

    def attach(self, pool: Pool, *, waiting: Callable[[], int], on_credit: Callable[[], None]) -> None:
        """Govern `pool`'s capped replicas; `waiting()` = its queued requests, `on_credit()` is called
        when credits arrive or the mode changes (the pool's admission controller `on_release`)."""
        self._pools[pool.model] = PoolCredits(pool, self, waiting, on_credit)
        self._pools[pool.model].sync()

    def add_demand(self, model: str, *, waiting: Callable[[], int], on_credit: Callable[[], None]) -> None:
        """Another queue dispatches on attached pool `model`'s replicas (a disaggregated pool's pair queue
        on each of its two sets): its waiters ask for credits as the pool's own do, and `on_credit()` is
        called with the pool's. Without it a pair request queued for a credit was never granted one."""
        self._pools[model].add_demand(waiting, on_credit)

    def held(self, model: str, replica_id: str) -> int:
        """Credits this instance holds on a replica of `model`."""
        rc = self._pools[model].replicas.get(replica_id)
        return 0 if rc is None else rc.held

    def sync(self, pool: Pool) -> None:
        """Before routing on `pool`: replicas added since the last call get a credit limit too."""
        pc = self._pools.get(pool.model)
        if pc is not None:
            pc.sync()

    def on_dispatch(self, replica: Replica) -> None:
        """A request now occupies a credit on `replica`."""
        pc = self._pools.get(replica.model)
        rc = None if pc is None else pc.replicas.get(replica.replica_id)
        if pc is None or rc is None:
            return
        rc.peak = max(rc.peak, replica.inflight_requests)
        pc.last_dispatch_s = self.clock.now_s()
        self.wake()

    def wake(self) -> None:
        """Something changed (a claim, a release, membership): run the refiller soon."""
        if self._closed:
            return
        self._wake.set()
        if self._task is None and self._autostart:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="slot-credits")

    async def aclose(self) -> None:
        """Stop the refiller and give every credit and presence back (best effort, bounded)."""
        self._closed = True
        await cancel_and_wait([self._task])
        held: list[HeldCredit] = []
        for pc in self._pools.values():
            for rc in pc.replicas.values():
                held += rc.credits
                rc.credits = []
            if pc.presence is not None:
                held.append(pc.presence)
                pc.presence = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.link.release(held)
                await self.link.drain()

    async def step(self) -> float | None:
        """One refiller round at the clock's current time; returns when the next one is due."""
        for pc in self._pools.values():
            await self.link.release(pc.detach_gone())
            pc.sync()
        now_s = self.clock.now_s()
        await self.link.renew([entry for entry in self._all_held() if entry[2].renew_at_s <= now_s])
        if self.link.probe_due():
            first = next(iter(self._pools.values()), None)
            if first is not None:
                await self.link.probe(first.presence_id)
        if self.mode is CreditMode.SHARED:
            for pc in self._pools.values():
                await refresh_contention(self.link, pc)
                await self._shed(pc)
                await self._acquire(pc)
                await update_presence(self.link, pc, self.linger_s)
        return self._next_due_s()

    async def _run(self) -> None:
        while not self._closed:
            self._wake.clear()
            try:
                due_s = await self.step()
            except Exception:
                logger.exception("slot credit refiller failed; retrying in %.1f s", PROBE_INTERVAL_S)
                if self._on_error is not None:
                    self._on_error()
                due_s = self.clock.now_s() + PROBE_INTERVAL_S
            timeout_s = None if due_s is None else max(MIN_TICK_S, due_s - self.clock.now_s())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._wake.wait()

    def _all_held(self) -> Iterator[HeldEntry]:
        for pc in self._pools.values():
            for rc in pc.replicas.values():
                for held in rc.credits:
                    yield pc, rc, held
            if pc.presence is not None:
                yield pc, None, pc.presence

    async def _shed(self, pc: PoolCredits) -> None:
        now_s = self.clock.now_s()
        window_over = now_s >= pc.window_end_s
        idle_pool = pc.waiting() == 0
        active = pc.active(now_s)
        released: list[HeldCredit] = []
        for rc in pc.replicas.values():
            count = rc.surplus()
            if count:
                rc.floating_after_s = now_s + SHED_HOLDOFF_S
            inflight = rc.replica.inflight_requests
            if window_over and idle_pool:
                keep = inflight
                if active:  # the window's peak, and the spare
                    keep = max(rc.peak, inflight + (1 if rc.replica.routable_at(now_s) else 0))
                count = max(count, rc.held - keep)
            released += rc.take(count)
            if window_over:
                rc.peak = inflight
        if window_over:
            pc.window_end_s = now_s + self.linger_s
        await self.link.release(released)

    async def _acquire(self, pc: PoolCredits) -> None:
        pc.starving = False
        while True:  # ends: each round takes credits (≤ the caps) or returns
            now_s = self.clock.now_s()
            need = pc.waiting()
            if need:
                pc.last_waiting_s = now_s
            if self.mode is not CreditMode.SHARED or not pc.active(now_s):
                return
            wanting = sorted(
                (rc for rc in pc.replicas.values() if rc.wants_credit(now_s, need > 0)), key=lambda r: r.held
            )
            picks = wanting[:need] if need else wanting
            if not picks:
                return
            leases = await self.link.calls(
                [self.store.acquire(rc.resource_id, rc.cap, self.ttl_s) for rc in picks]
            )
            got = self._accept(pc, picks, leases)
            if got:
                pc.on_credit()  # schedules the pool's admission pump (call_soon) ...
                await asyncio.sleep(0)  # ... which dispatches onto the new credits before we ask again
            if not got or not need:
                return

    def _accept(self, pc: PoolCredits, picks: list[ReplicaCredits], leases: list[Lease | None]) -> int:
        now_s = self.clock.now_s()
        got = 0
        for rc, lease in zip(picks, leases, strict=True):
            if lease is None or lease.degraded:
                if self.health.available:
                    rc.refused(now_s)
                    pc.starving = pc.waiting() > 0
                continue
            if self._closed or pc.replicas.get(rc.replica.replica_id) is not rc:
                self.link.spawn_release(lease)
                continue
            rc.credits.append(HeldCredit(lease, self.link.renew_at_s(now_s), now_s))
            rc.backoff_s = 0.0
            got += 1
        return got

    def _next_due_s(self) -> float | None:
        now_s = self.clock.now_s()
        times = [held.renew_at_s for _, _, held in self._all_held()]
        if self.mode is not CreditMode.SHARED:
            return min([*times, self.link.probe_at_s])
        for pc in self._pools.values():
            if pc.held() or pc.presence is not None:
                times += [pc.window_end_s, pc.checked_s + CONTENTION_REFRESH_S]
            if pc.presence is not None and pc.waiting() == 0:
                times.append(pc.last_waiting_s + self.linger_s)
            for rc in pc.replicas.values():
                times += [end_s for end_s in rc.floating_ends_s() if end_s > now_s]
                if pc.active(now_s):
                    times += [t for t in (rc.retry_at_s, rc.floating_after_s) if t > now_s]
        return min(times, default=None)

    def _mode_changed(self, mode: CreditMode) -> None:
        if mode is CreditMode.SHARED:  # renew everything held at once
            now_s = self.clock.now_s()
            for _, _, held in self._all_held():
                held.renew_at_s = now_s
        for pc in self._pools.values():
            pc.on_credit()
