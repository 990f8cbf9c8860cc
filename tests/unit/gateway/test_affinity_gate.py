"""The learned cap's affinity gate, end to end through admission's claim: what the policy reports of
the pool's prefix spread reaches each replica's affinity share."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from admission.tenant_gate import TenantGate
from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.proxy.admission_assembly import build_admission
from gateway.proxy.route import Router
from gateway.upstream.registry import ReplicaRegistry
from gateway.upstream.replica import Replica
from router.keys import build_routing_request

MODEL = "m"
URLS = [f"http://10.0.0.{n}:8000" for n in range(1, 5)]
SHARED = "s" * 8192  # 128 blocks of a shared prefix: ~2,048 tokens
QUESTION = "q" * 512  # 128 tokens of its own


def pool_admission(policy: str) -> tuple[Callable[[str], str], dict[str, Replica]]:
    """`send(prompt)`: claim and release a slot through the pool's admission, answer the replica id;
    and the pool's replicas by id."""
    settings = parse_settings({"pools": [{"model": MODEL, "replicas": {"static": URLS}, "policy": policy}]})
    clock = FakeClock(0.0)
    metrics = GatewayMetrics()
    registry = ReplicaRegistry(settings, metrics, clock, random.Random(1))
    admission = build_admission(
        settings,
        registry=registry,
        router=Router(metrics),
        gate=TenantGate.in_memory(clock),
        clock=clock,
        metrics=metrics,
    ).pool(MODEL)

    def send(prompt: str) -> str:
        slot = admission.claim(build_routing_request(MODEL, prompt, session_key="thread-1"))
        assert slot is not None
        slot.release()
        return slot.replica.replica_id

    return send, dict(registry.pools[MODEL].replicas)


@pytest.mark.parametrize("policy", ["prefix-affinity", "session-affinity", "prefix-index"])
def test_a_shared_prefix_routed_by_an_affine_policy_turns_the_gate_on(policy: str) -> None:
    """Repeats of one prefix: from the second on, 8192 of each prompt's 8704-odd characters are held
    by one replica and not the others, so the share of the replica taking them climbs past the 0.25
    at which the learned cap is dropped (before the ring policies reported their spread, it stayed
    None there: the cap applied)."""
    send, replicas = pool_admission(policy)
    (owner,) = {send(SHARED + QUESTION + str(n)) for n in range(60)}
    share = replicas[owner].cost.affinity_share
    assert share is not None and share > 0.25


@pytest.mark.parametrize("policy", ["prefix-affinity", "session-affinity", "prefix-index"])
def test_unique_prompts_leave_the_gate_off(policy: str) -> None:
    """Nothing held by anyone: every replica that took a request reads a share of 0 (the cap applies)."""
    send, replicas = pool_admission(policy)
    taken = {send(f"{n:04d}" * 2048) for n in range(60)}
    assert {replicas[rid].cost.affinity_share for rid in taken} == {0.0}
