"""Settings of a pool's learned latency model and the batch budget it finds (`latency_model:` of a
pool), and of queued requests waiting for their prefix's replica (`prefix_wait:`, `PrefixWaitSettings`).

Read by `gateway.upstream.replica_cost` (one model per replica, `router.latency_model`). The model is
always learned when enabled (a few dozen float operations per request); what uses it:
- the `predicted-latency` policy (and `sticky-prefix`'s learned prefill rate);
- the *learned cap*, each replica's batch budget (on: `adaptive_cap`): how many requests its engine
  may run for its token latency to stay at the set point `tpot_target_ratio` (0.8) × `slo.tpot_s`
  (0.05 s by default). Where the engine exports an inter-token latency histogram (vLLM, SGLang) every
  scrape that closes a window moves it, on the engine's whole batch: every gateway instance learns the
  same budget from the same engine and takes the requests the others run there off its own share.
  Finished requests' TPOTs then trim the set point toward the objective's 95th percentile, within
  [0.5, 0.9] × `slo.tpot_s` (`gateway.upstream.set_point_trim`). No budget is set while fewer than
  twice `min_cap_per_replica` run (a cold engine's first prefills say nothing of its batch). Elsewhere
  the TPOT of this instance's finished streams moves the cap itself, a generation late
  (`cap_paced_by_generation`). The rules are `gateway.upstream.tpot_limit`'s. Never below
  `min_cap_per_replica` (8); a configured `max_concurrency_per_replica` still bounds this instance.
  Requests above it wait in admission — each for the replica holding its prefix while that fits its
  TTFT objective (`prefix_wait`) — or are refused at arrival with 429 and a computed `Retry-After`
  when the release forecast says they would wait past their class's bound, instead of queueing in the
  engine, where every request would slow everyone's tokens. Exported as
  `llm_gateway_learned_max_concurrency{replica}` (0 while there is none). Measured against no cap and
  the earlier gated cap in docs/BENCHMARKS.md ("Overload").
- `cap_max_affinity_share` (None: no gate) drops the cap on a replica while that share or more of the
  prompt tokens dispatched to it are held by some replicas of the pool and not others
  (`ReplicaCost.affinity_share`). It was needed while the cap learned only from finished requests; with
  the engine's token latency the cap holds prefix-heavy pools too, and holding is what keeps their
  prefixes warm, so it is off by default and kept for configurations that set it.

What an operator changes: the objective (`slo.tpot_s`, `slo.ttft_s`) to what the fleet must deliver —
an engine slower than the set point at every batch is served at the load it has (cuts that do not lower
its latency are undone, a cap at the floor is probed: `gateway.upstream.cut_check`) —,
`tpot_target_ratio` where the set point starts (finished requests trim it), and `adaptive_cap: false`
to turn it off. The others are for experiments.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from router.latency_model import DEFAULT_FORGETTING_FACTOR, DEFAULT_WARM_AFTER
from router.prefix_wait import DEFAULT_MIN_MATCH_RATIO

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
    cap_max_affinity_share: float | None = Field(None, ge=0, le=1)
    """No learned cap on a replica while this share or more of the prompt tokens dispatched to it were
    held by some replicas of the pool and not others (`ReplicaCost.affinity_share`); None (default):
    the cap applies whatever the sharing (module docstring)."""
    tpot_target_ratio: float = Field(DEFAULT_TPOT_TARGET_RATIO, gt=0, le=1)
    """The learned cap's set point as a share of `slo.tpot_s`: the limit holds the mean token latency
    there and requests scatter around the mean. With the engine's token latency this is where the set
    point starts; finished requests then trim it (`gateway.upstream.set_point_trim`: up to 0.9, or
    this ratio when higher)."""
    deadline_headroom: bool = True
    """A queued request whose class's wait runs out may take a slot in the headroom the learned cap
    leaves below the objective (the cap × 1 / `tpot_target_ratio`) instead of being refused
    `queue_timeout`: it was admitted on a forecast a later cut broke (`PoolAdmission.try_at_deadline`).
    False: it is refused."""
    cap_paced_by_generation: bool = True
    """Each update of the learned cap takes its share (update_every / requests running) of one
    generation's step, so the late TPOT feedback neither compounds cuts nor overshoots growth, and the
    limit grows back by the gradient (up to × 2 per generation) after a cut that went too far
    (`gateway.upstream.tpot_limit`); only while the engine exports no token latency. False: the plain
    gradient limit, a whole step per update."""


class PrefixWaitSettings(BaseModel):
    """A pool's `prefix_wait:`: a queued request keeps waiting for the replica that holds its prompt's
    prefix, while another replica's free slot would make it a cache miss, as long as its expected wait
    there plus its predicted TTFT keeps within its TTFT objective (router/prefix_wait.py; the
    controller's holds: admission/holds.py). The replica is the prefix index's best match
    (`prefix-index`, `sticky-prefix`, `predicted-latency`) or the key's owner on the ring
    (`prefix-affinity`, `session-affinity`), whatever this instance has seen go there (the owner is the
    same for every instance); other policies hold for nothing. It matters only with a cap
    (`max_concurrency_per_replica`, or the learned one): without one no replica is ever full, so
    nothing waits.

    On by default: past the knee it keeps the prefix-cache hit ratio and SLO goodput up
    (docs/BENCHMARKS.md, "Queued requests keep their prefix replica"); where it does not act (no cap,
    no owner, no TTFT objective) it costs one pass over the views."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    min_match_ratio: float = Field(DEFAULT_MIN_MATCH_RATIO, ge=0, le=1)
    """The share of a prompt's blocks the prefix index's best match must hold for the request to wait
    for it (`prefix-index`, `sticky-prefix`, `predicted-latency`; a ring's key owner needs none)."""
