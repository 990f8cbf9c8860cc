"""What the release forecast's prior is made of, before a pool's first request completes
(`admission.release_forecast`): each held request's output budget × the pool's time per output token."""

from __future__ import annotations

from admission.ticket import AdmissionRequest
from gateway.upstream.registry import Pool


def output_budget(request: AdmissionRequest) -> int | None:
    """The request's output budget in tokens (`max_tokens`), None when it set none."""
    return None if request.routing is None else request.routing.max_tokens


def pool_token_latency_s(pool: Pool) -> float | None:
    """The pool's time per output token: the mean of its engines' last token-latency windows
    (`ReplicaCost.token_latency_s`), None when no engine reported one; with the learned cap on, at
    most the TPOT objective (`slo.tpot_s`). The cap holds the engines at its set point, so a window
    above the objective (an overload's onset on cold caches: every step carries prefill, 3–5 × the
    objective) is what the cap is cutting, not what the running requests see over their generation;
    taken whole it forecast releases a generation late, and early refusal turned away even the top
    class."""
    known = [r.cost.token_latency_s for r in pool.replicas.values() if r.cost.token_latency_s]
    if not known:
        return None
    mean_s, settings = sum(known) / len(known), pool.settings
    capped = settings.latency_model.enabled and settings.latency_model.adaptive_cap
    return min(mean_s, settings.slo.tpot_s) if capped and settings.slo.tpot_s else mean_s
