"""LoRA slots (`router.lora`): a request for an adapter stays off replicas whose LoRA slots are full of
other adapters, softly, and only when the engines report their slots."""

from __future__ import annotations

import random

from router.keys import build_routing_request
from router.lora import lora_slots, lora_would_wait
from router.presets import PolicyContext, build_policy
from router.types import EngineLoad, ReplicaView


def _replica(
    rid: str, running: set[str], max_loras: int | None = 1, stale: bool = False, inflight: int = 0
) -> ReplicaView:
    engine = EngineLoad(running_adapters=frozenset(running), max_loras=max_loras, stale=stale)
    return ReplicaView(rid, f"http://{rid}", engine=engine, inflight_requests=inflight)


def _ids(replicas: list[ReplicaView]) -> list[str]:
    return [r.replica_id for r in replicas]


def test_an_adapter_goes_where_it_runs_or_where_a_slot_is_free() -> None:
    busy_other, running_it, free = _replica("a", {"b"}), _replica("b", {"sql"}), _replica("c", set())
    request = build_routing_request("sql", "x", lora_adapter=True)
    assert _ids(lora_slots(request, [busy_other, running_it, free])) == ["b", "c"]
    assert lora_would_wait(busy_other, "sql") and not lora_would_wait(running_it, "sql")


def test_two_slots_leave_room_for_a_second_adapter() -> None:
    one_of_two = _replica("a", {"b"}, max_loras=2)
    assert not lora_would_wait(one_of_two, "sql")
    assert lora_would_wait(_replica("a", {"b", "c"}, max_loras=2), "sql")


def test_it_never_empties_the_set_and_ignores_what_it_does_not_know() -> None:
    request = build_routing_request("sql", "x", lora_adapter=True)
    full = [_replica("a", {"b"}), _replica("b", {"c"})]
    assert _ids(lora_slots(request, full)) == ["a", "b"], "every one full: all kept"
    unknown = [_replica("a", {"b"}), _replica("b", {"c"}, max_loras=None), _replica("c", {"d"}, stale=True)]
    assert _ids(lora_slots(request, unknown)) == ["b", "c"], "no max_loras, or a stale sample: kept"


def test_the_base_model_is_not_held_to_lora_slots() -> None:
    request = build_routing_request("base", "x")
    assert _ids(lora_slots(request, [_replica("a", {"b"}), _replica("b", set())])) == ["a", "b"]


def test_every_policy_applies_it_before_its_own_choice() -> None:
    busy = _replica("a", {"other"}, inflight=0)
    idle_but_later = _replica("b", set(), inflight=5)
    request = build_routing_request("sql", "prompt", lora_adapter=True)
    for name in ("least-load", "round-robin", "prefix-index", "power-of-two"):
        policy = build_policy(name, PolicyContext(rng=random.Random(1)))
        decision = policy.decide(request, [busy, idle_but_later])
        assert decision is not None and decision.replica_id == "b", name
