"""Settings of a pool's learned latency model and the batch cap it finds (`latency_model:` of a pool),
and of queued requests waiting for their prefix's replica (`prefix_wait:`, `PrefixWaitSettings`).

Read by `gateway.upstream.replica_cost` (one model per replica, `router.latency_model`). The model is
always learned when enabled (it costs a few dozen float operations per request); what uses it:
- the `predicted-latency` policy (and `sticky-prefix`'s learned prefill rate);
- the *learned cap* (off by default, see below): with `adaptive_cap` on and the pool's `slo.tpot_s`
  set, each replica's cap is
  found from its TPOT: once the measured TPOT has broken `slo.tpot_s`, a gradient limit on it
  (`gateway.upstream.tpot_limit`: shrinks by slo/TPOT while broken, grows by √limit while held) —
  never below `min_cap_per_replica` and never above `max_concurrency_per_replica` when that is set.
  The TPOT model's own solved batch is not used as a cap: it capped replicas below the knee in the
  benchmark (docs/BENCHMARKS.md, issue 15).
  Why off by default: measured on the long-prompt regime at 2× the knee (docs/BENCHMARKS.md, issue 15),
  the gradient limit cut SLO goodput from 16.9 to 6.9 req/s (62 % → 25 % of requests within the SLO):
  its feedback arrives a whole generation late (a TPOT is known when a request ends, ~10 s there), so
  it over- and under-shoots, and a capped replica takes requests from the queue whatever prefix they
  hold (prefix-cache hits 80 % → 52 %). Re-measured with `prefix_wait` and `tpot_target_ratio` 0.8
  it still lost there (7.5 against 17.9 req/s at 2×: misses' prefills, not the batch, break TPOT),
  while on a decode-bound workload (256-token prompts, TPOT objective 20 ms) it kept 0.87–0.88× of the
  knee's goodput at 1.5× and 2× where no cap kept 0.17× and 0 — so it is an opt-in for such fleets.
  Requests above it wait in admission (the priority queues) instead of in the engine's own queue,
  where they would all slow each other down. While the TPOT model is cold (fewer than `warm_after`
  samples) or sees no cost in the batch, there is no learned cap. Exported as
  `llm_gateway_learned_max_concurrency{replica}` (0 while there is none).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gateway.upstream.tpot_limit import DEFAULT_TARGET_RATIO
from router.latency_model import DEFAULT_FORGETTING_FACTOR, DEFAULT_WARM_AFTER
from router.prefix_wait import DEFAULT_MIN_MATCH_RATIO

DEFAULT_CAP_MAX_CACHED_SHARE = 0.5


class LatencyModelSettings(BaseModel):
    """A pool's `latency_model:` (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    forgetting_factor: float = Field(DEFAULT_FORGETTING_FACTOR, gt=0.5, le=1)
    """RLS forgetting λ: an effective memory of about 1 / (1 − λ) observations (0.98 → 50)."""
    warm_after: int = Field(DEFAULT_WARM_AFTER, ge=1)
    """Observations before a model's predictions are used."""
    adaptive_cap: bool = False
    min_cap_per_replica: int = Field(8, ge=1)
    cap_max_cached_share: float = Field(DEFAULT_CAP_MAX_CACHED_SHARE, ge=0, le=1)
    """No learned cap on a replica while this share or more of the prompt tokens dispatched to it were
    expected cached (`ReplicaCost.cached_share`): there affinity decides the outcome, and a cap spills
    requests to replicas that miss (module docstring). 1.0 keeps the cap whatever the sharing."""
    tpot_target_ratio: float = Field(DEFAULT_TARGET_RATIO, gt=0, le=1)
    """The learned cap's set point as a share of `slo.tpot_s`: the limit holds the mean TPOT there, and
    requests scatter around the mean (`gateway.upstream.tpot_limit`)."""


class PrefixWaitSettings(BaseModel):
    """A pool's `prefix_wait:`: a queued request keeps waiting for the replica that holds its prompt's
    prefix, while another replica's free slot would make it a cache miss, as long as its expected wait
    there plus its predicted TTFT keeps within its TTFT objective (router/prefix_wait.py; the
    controller's holds: admission/holds.py). Needs a policy with a prefix index (`prefix-index`,
    `sticky-prefix`, `predicted-latency`) and matters only with a cap (`max_concurrency_per_replica`,
    or the learned one): without one no replica is ever full, so nothing waits.

    On by default, from docs/BENCHMARKS.md ("Queued requests keep their prefix replica"): with a cap of
    64 at 2× the knee it raised SLO goodput from 16.2–17.3 to 21.2–21.3 req/s and the prefix-cache hit
    ratio from 44–48 % to 65 %, and at 1.5× it changed goodput by +1–2 % with a 19–23 % lower TTFT p95;
    where it does not act (no cap, no prefix index, no TTFT objective) it costs one pass over the views."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    min_match_ratio: float = Field(DEFAULT_MIN_MATCH_RATIO, ge=0, le=1)
    """The share of a prompt's blocks a replica must hold for the request to wait for it."""
