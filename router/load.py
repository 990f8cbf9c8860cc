"""How loaded a replica is, in the units a policy asks for.

`request_load` is the gateway's own in-flight request count (the truth for routing) plus the engine's
reported waiting queue when a fresh engine sample exists; engine signals refine, never replace, it.
Token-aware load (what a request will cost there): `queued_prefill_tokens` — the uncached prompt
tokens it would wait behind, its own included — and `running_sequences`, the decode batch.
"""

from __future__ import annotations

from enum import StrEnum

from router.types import EngineLoad, ReplicaView, RoutingRequest

NO_SAMPLE = EngineLoad()
"""What a replica without a fresh engine sample counts as: nothing running, waiting or in the KV."""


class LoadUnit(StrEnum):
    """What "load" counts: in-flight requests, or in-flight estimated tokens (prompt + max_tokens)."""

    REQUESTS = "requests"
    TOKENS = "tokens"


def inflight_load(replica: ReplicaView, unit: LoadUnit = LoadUnit.REQUESTS) -> int:
    """The gateway's own in-flight count for `replica` in `unit`."""
    return replica.inflight_tokens if unit is LoadUnit.TOKENS else replica.inflight_requests


def fresh_sample(engine: EngineLoad | None) -> EngineLoad:
    """The engine's sample when there is one and it is fresh, else `NO_SAMPLE` (all zero)."""
    return NO_SAMPLE if engine is None or engine.stale else engine


def request_load(replica: ReplicaView) -> float:
    """In-flight requests plus the engine's waiting queue when its sample is fresh."""
    return replica.inflight_requests + fresh_sample(replica.engine).waiting


def running_sequences(replica: ReplicaView) -> float:
    """Sequences decoding on the replica: the gateway's own count of requests past their first token,
    or the engine's `running` when a fresh sample reports more (other gateway instances' traffic)."""
    return max(float(replica.decoding_requests), fresh_sample(replica.engine).running)


def waiting_requests(replica: ReplicaView) -> float:
    """Requests on the replica without a first token: in-flight minus decoding, or the engine's fresh
    `waiting` when larger."""
    prefilling = max(0, replica.inflight_requests - replica.decoding_requests)
    return max(float(prefilling), fresh_sample(replica.engine).waiting)


def queued_prefill_tokens(replica: ReplicaView, request: RoutingRequest, matched_blocks: int | None) -> int:
    """The prefill tokens `request` would wait behind on `replica`, its own uncached tokens included:
    the replica's `prefill_tokens_inflight` + the request's prompt minus the `matched_blocks` it holds."""
    return replica.prefill_tokens_inflight + request.uncached_tokens(matched_blocks)
