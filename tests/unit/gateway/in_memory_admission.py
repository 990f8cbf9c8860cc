"""A pool's admission as the app builds it, in memory, on a fake clock: for tests that claim slots
through admission without a server."""

from __future__ import annotations

import random

from admission.tenant_gate import TenantGate
from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import Settings
from gateway.proxy.admission_assembly import build_admission
from gateway.proxy.admit import PoolAdmission
from gateway.proxy.route import Router
from gateway.upstream.registry import ReplicaRegistry
from gateway.upstream.replica import Replica


def pool_admission(settings: Settings, model: str, seed: int = 1) -> tuple[PoolAdmission, ReplicaRegistry]:
    """The admission of `model`'s pool under `settings` (clock at 0, in-memory tenant gate), and the
    registry holding its replicas."""
    clock = FakeClock(0.0)
    metrics = GatewayMetrics()
    registry = ReplicaRegistry(settings, metrics, clock, random.Random(seed))
    admission = build_admission(
        settings,
        registry=registry,
        router=Router(metrics),
        gate=TenantGate.in_memory(clock),
        clock=clock,
        metrics=metrics,
    )
    return admission.pool(model), registry


def learn_a_cap_of_50(replica: Replica) -> None:
    """Eight finished streams at twice a 50 ms TPOT objective with 100 in flight: the replica's learned
    cap becomes 50 (the first cut, 100 × 0.5; `gateway.upstream.tpot_limit`)."""
    for _ in range(8):
        replica.cost.learn_tpot(running=90, engine=None, tpot_s=0.1, inflight=100)
    assert replica.cost.learned_cap == 50
