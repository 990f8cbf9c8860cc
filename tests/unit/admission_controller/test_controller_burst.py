"""A burst of 500 admits with random cancellations, expiries and tenant limits leaves nothing behind."""

import asyncio
import random
from collections import Counter

from admission.outcomes import AdmissionRefused
from admission.tenants import Tenant

from .fakes import make_harness, req, settle

CLASSES = ("critical", "interactive", "batch")


async def test_burst_of_500_with_random_cancellations_ends_empty_with_all_leases_returned() -> None:
    rng = random.Random(20240605)
    h = make_harness(slots=8, max_depth=200)
    tenants = [
        Tenant("a", max_concurrent=120, tokens_per_min=300_000, weight=1.0),
        Tenant("b", max_concurrent=60, requests_per_min=400, weight=2.0),
        Tenant("c", weight=0.5),
    ]
    max_seen = Counter[str]()

    async def client(n: int) -> None:
        tenant = rng.choice(tenants)
        request = req(f"r{n}", rng.choice(CLASSES), rng.randint(10, 4000), tenant)
        grant = await h.controller.admit(request)
        try:
            max_seen["slots"] = max(max_seen["slots"], h.fleet.in_use)
            if tenant.max_concurrent is not None:
                held = await h.gate.tenant_leases.count(tenant.name)
                max_seen[tenant.name] = max(max_seen[tenant.name], held)
            for _ in range(rng.randint(0, 8)):
                await asyncio.sleep(0)
            await grant.reconcile(rng.randint(0, 4000))
        finally:
            await grant.release()

    tasks: list[asyncio.Task[None]] = []
    for n in range(500):
        tasks.append(asyncio.create_task(client(n)))
        if rng.random() < 0.3:
            await asyncio.sleep(0)
        if rng.random() < 0.15:
            rng.choice(tasks).cancel()  # a client leaves: queued, running or not started yet
        if rng.random() < 0.03:
            h.timers.advance(4.0)  # time passes: some waiters time out, leases get renewed
    for _ in range(2000):
        if all(task.done() for task in tasks):
            break
        await settle(3)
        h.timers.advance(0.5)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await h.gate.flush()

    outcomes = Counter(
        "served" if r is None else str(r.reason) if isinstance(r, AdmissionRefused) else type(r).__name__
        for r in results
    )
    assert sum(outcomes.values()) == 500
    assert outcomes["served"] > 150 and outcomes["CancelledError"] > 20, outcomes
    assert outcomes["queue_full"] + outcomes["queue_timeout"] + outcomes["rate_limited"] > 0, outcomes
    assert len(h.controller) == 0 and sum(h.controller.depths().values()) == 0
    assert h.fleet.in_use == 0 and max_seen["slots"] <= 8
    assert max_seen["a"] <= 120 and max_seen["b"] <= 60
    for tenant in tenants:
        assert await h.gate.tenant_leases.count(tenant.name) == 0
    assert h.timers.pending == 0  # no expiry timer, no lease renewal left
    assert sum(h.controller.stats.dispatched.values()) == len(h.fleet.dispatched)
