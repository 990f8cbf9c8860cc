"""LoRA slots: keep a request for an adapter off replicas where it would wait for one.

vLLM runs at most `max_loras` distinct adapters in a batch; a request for another adapter waits until
one of the running adapters' requests have all finished, however idle the replica is otherwise. Its
`vllm:lora_requests_info` says which adapters run now and `max_lora` (scraped into `EngineLoad`). The
rule, as the Gateway API inference extension's LoRA affinity filter applies it:

    keep the candidates where the adapter already runs, or where a LoRA slot is free
    (len(running_adapters) < max_loras); when none is, keep them all.

Soft (never empties the set), and only for requests that name an adapter (`RoutingRequest.
lora_adapter`) and replicas with a fresh sample that reports `max_loras` — every other candidate is
kept. Applied by every policy after eligibility (`router.profile.Profile.decide`): it only removes
replicas where the request would queue behind other adapters.
"""

from __future__ import annotations

from router.load import fresh_sample
from router.types import ReplicaView, RoutingRequest


def lora_would_wait(replica: ReplicaView, adapter: str) -> bool:
    """True when `replica`'s engine reports its LoRA slots full of other adapters."""
    sample = fresh_sample(replica.engine)
    if sample.max_loras is None or adapter in sample.running_adapters:
        return False
    return len(sample.running_adapters) >= sample.max_loras


def lora_slots(request: RoutingRequest, candidates: list[ReplicaView]) -> list[ReplicaView]:
    """The candidates where `request`'s adapter would not wait for a LoRA slot (module docstring)."""
    if not request.lora_adapter:
        return candidates
    kept = [replica for replica in candidates if not lora_would_wait(replica, request.model)]
    return kept or candidates
