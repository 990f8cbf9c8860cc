"""Preemption notices: from the admin API, and from discovery's terminating endpoints."""

from __future__ import annotations

import asyncio
import random

import pytest

from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.proxy.attempt import Attempt
from gateway.proxy.preemption import Preemption
from gateway.upstream.discovery.types import ReplicaSet
from gateway.upstream.registry import ReplicaRegistry
from router.types import Branch, Decision

URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]


def registry(**pool: object) -> ReplicaRegistry:
    settings = parse_settings({"pools": [{"model": "m", "replicas": {"static": URLS}, **pool}]})
    return ReplicaRegistry(settings, GatewayMetrics(), FakeClock(), random.Random(0))


def attempt_on(reg: ReplicaRegistry, index: int) -> Attempt:
    replica = list(reg.pools["m"].replicas.values())[index]
    decision = Decision(replica_id=replica.replica_id, policy="test", branch=Branch.LEAST_LOAD)
    return Attempt(reg.claim(replica, decision, 0), 1, FakeClock())


async def test_an_admin_notice_drains_now_and_cuts_what_still_runs_at_the_deadline() -> None:
    reg = registry()
    preemption = Preemption(reg)
    doomed, other = attempt_on(reg, 0), attempt_on(reg, 1)
    with preemption.running(doomed), preemption.running(other):
        cut_in_s = preemption.notify(doomed.slot.replica, deadline_s=0.06, margin_s=0.02)
        assert cut_in_s == pytest.approx(0.04) and doomed.slot.replica.draining
        await asyncio.sleep(0.01)
        assert not doomed.preempted, "not before the deadline minus the margin"
        await asyncio.sleep(0.06)
        assert doomed.preempted and not other.preempted
    assert preemption.running_on(doomed.slot.replica) == 0
    await preemption.aclose()


async def test_a_terminating_endpoint_is_a_notice_of_the_pools_grace_period() -> None:
    reg = registry(terminating_grace_s=0.03)
    pool = reg.pools["m"]
    preemption = Preemption(reg)
    running = attempt_on(reg, 0)
    with preemption.running(running):
        already = {r.replica_id for r in pool.replicas.values() if r.discovery_draining}
        reg.apply_membership(pool, ReplicaSet.of(ready=[URLS[1]], draining=[URLS[0]]))
        preemption.terminating(pool, already)
        await asyncio.sleep(0.02)  # the margin (2 s) exceeds the grace: the cut is due at once
        assert running.preempted
        replica = running.slot.replica
        assert replica.discovery_draining and not replica.draining, "discovery's drain, not an operator's"
    await preemption.aclose()


async def test_without_a_grace_period_a_terminating_endpoint_is_only_drained() -> None:
    reg = registry()
    pool = reg.pools["m"]
    preemption = Preemption(reg)
    running = attempt_on(reg, 0)
    with preemption.running(running):
        reg.apply_membership(pool, ReplicaSet.of(ready=[URLS[1]], draining=[URLS[0]]))
        preemption.terminating(pool, set())
        await asyncio.sleep(0.02)
        assert not running.preempted and running.slot.replica.discovery_draining
