"""Settings of a pool's learned latency model and the batch cap it finds (`latency_model:` of a pool),
and of queued requests waiting for their prefix's replica (`prefix_wait:`, `PrefixWaitSettings`).

Read by `gateway.upstream.replica_cost` (one model per replica, `router.latency_model`). The model is
always learned when enabled (it costs a few dozen float operations per request); what uses it:
- the `predicted-latency` policy (and `sticky-prefix`'s learned prefill rate);
- the *learned cap* (on by default): with `adaptive_cap` on and the pool's `slo.tpot_s` set (0.05 s
  by default), each replica's cap is found from its TPOT: once the measured TPOT has broken the set
  point `tpot_target_ratio` (0.8) × `slo.tpot_s`, a gradient limit on it (`gateway.upstream.tpot_limit`:
  × target/TPOT per generation of requests, clamped to [0.5, 2], plus √limit while held; paced by
  `cap_paced_by_generation`, on) — never below
  `min_cap_per_replica` (8) and never above `max_concurrency_per_replica` when that is set — except
  on a replica whose `affinity_share` (`gateway.upstream.replica_cost`: the share of its dispatched
  prompt tokens that some replicas of the pool hold and others do not) is at or above
  `cap_max_affinity_share` (0.25): there the limit is dropped.
  Requests above the cap wait in admission (the priority queues, refused with 429 and `Retry-After`
  past their depth or deadline) instead of in the engine's own queue, where they would all slow each
  other down. Exported as `llm_gateway_learned_max_concurrency{replica}` (0 while there is none).
  Why on, gated (docs/BENCHMARKS.md, issue 15, "Item 5 with default settings, third round"): on a
  decode-bound fleet (2 × H100 13B, 256-token prompts, TPOT objective 20 ms, 40 s windows) it kept
  1.04–1.06× and 1.00–1.01× of the knee's SLO goodput at 1.5× and 2× the knee (two rounds, paced;
  the unpaced limit 0.85–0.97× and 0.82–0.93× over nine), where no cap keeps 0.05× and 0
  (every replica batches without bound and TPOT breaks for everyone). On long shared prefixes (4 ×
  H100, 256 × 2,048-token prefixes) a cap lost — a capped replica's queued requests go to replicas
  without their prefix, each miss puts a 2,176-token prefill into everyone's decode steps, TPOT rises,
  the limit shrinks further (7.5 against 17.9 req/s at 2×) — so the gate keeps it off there, and the
  defaults then equal no cap (21.28 vs 21.24 req/s at 1.5×, 19.16 vs 18.57 at 2×). Why the set point
  is 0.8: the limit holds the *mean* TPOT at the set point and requests scatter around the mean.
  The TPOT model's own solved batch is not used as a cap: it capped replicas below the knee in the
  benchmark. Known cost: an engine slower than the set point even at small batches (a TPOT objective
  below what the hardware does) is held at `min_cap_per_replica`; set `slo.tpot_s` to what the fleet
  can do, or `adaptive_cap: false`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from router.latency_model import DEFAULT_FORGETTING_FACTOR, DEFAULT_WARM_AFTER
from router.prefix_wait import DEFAULT_MIN_MATCH_RATIO

DEFAULT_CAP_MAX_AFFINITY_SHARE = 0.25
DEFAULT_TPOT_TARGET_RATIO = 0.8


class LatencyModelSettings(BaseModel):
    """A pool's `latency_model:` (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    forgetting_factor: float = Field(DEFAULT_FORGETTING_FACTOR, gt=0.5, le=1)
    """RLS forgetting λ: an effective memory of about 1 / (1 − λ) observations (0.98 → 50)."""
    warm_after: int = Field(DEFAULT_WARM_AFTER, ge=1)
    """Observations before a model's predictions are used."""
    adaptive_cap: bool = True
    min_cap_per_replica: int = Field(8, ge=1)
    cap_max_affinity_share: float = Field(DEFAULT_CAP_MAX_AFFINITY_SHARE, ge=0, le=1)
    """No learned cap on a replica while this share or more of the prompt tokens dispatched to it were
    held by some replicas of the pool and not others (`ReplicaCost.affinity_share`): there the choice
    of replica decides the prefill, and a cap spills queued requests to replicas that miss (module
    docstring). 1.0 keeps the cap whatever the sharing."""
    tpot_target_ratio: float = Field(DEFAULT_TPOT_TARGET_RATIO, gt=0, le=1)
    """The learned cap's set point as a share of `slo.tpot_s`: the limit holds the mean TPOT there, and
    requests scatter around the mean (`gateway.upstream.tpot_limit`)."""
    cap_paced_by_generation: bool = True
    """Each update of the learned cap takes its share (update_every / requests running) of one
    generation's step, so the late TPOT feedback neither compounds cuts nor overshoots growth, and the
    limit grows back by the gradient (up to × 2 per generation) after a cut that went too far
    (`gateway.upstream.tpot_limit`). False: the plain gradient limit, a whole step per update (measured
    worse: module docstring)."""


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
