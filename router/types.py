"""Frozen values exchanged between the gateway and the routing policies.

Policies only ever see these immutable views; the mutable state they are taken from lives in the
gateway's upstream registry (one place). A view is cheap to build: one per replica per decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from core.tokens import CHARS_PER_TOKEN
from router.latency_model import LatencyEstimate


class Branch(StrEnum):
    """Why a policy chose what it chose. Becomes a metric label and the `x-gateway-route` header."""

    ROUND_ROBIN = "round_robin"
    LEAST_LOAD = "least_load"
    RING_HIT = "ring_hit"
    SPILLOVER = "spillover"
    ALL_OVER_BOUND = "all_over_bound"
    PREFIX_MATCH = "prefix_match"
    PREFIX_MISS = "prefix_miss"
    IMBALANCE = "imbalance"
    SESSION_HIT = "session_hit"
    SESSION_BREAK = "session_break"
    SESSION_NONE = "session_none"
    POWER_OF_TWO = "power_of_two"
    SINGLE_CANDIDATE = "single_candidate"
    NO_KEY = "no_key"
    FAIL_OPEN = "fail_open"
    STICKY = "sticky"
    SLO_MET = "slo_met"
    SLO_BEST_EFFORT = "slo_best_effort"
    SLO_PREFIX_OVER_TPOT = "slo_prefix_over_tpot"
    COLD_MODEL = "cold_model"
    PINNED = "pinned"
    """Any policy: the request may go to one replica only, the one holding its state (`RoutingRequest.
    pinned`); the policy's own branch would describe a choice that was not made."""


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What a replica's engine last reported about itself (scraped from its /metrics).

    `age_s` is how old the sample is; `stale` is set by the scraper when the sample is older than its
    staleness bound or the last scrape failed. Engine signals refine the gateway's own in-flight counts,
    which remain the truth for routing.
    """

    running: float = 0.0
    waiting: float = 0.0
    kv_usage_ratio: float = 0.0
    prefix_cache_hit_ratio: float | None = None
    age_s: float = 0.0
    stale: bool = False
    running_adapters: frozenset[str] = frozenset()
    """LoRA adapters with requests running on the engine now (vLLM); empty when unknown."""
    max_loras: int | None = None
    """How many adapters the engine runs in one batch (vLLM's `max_lora`); None when unknown."""


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """An immutable snapshot of one replica as routing sees it.

    Token-aware load, from the gateway's own accounting (`gateway.upstream.slot`):
    `prefill_tokens_inflight` = the uncached prompt tokens of the requests dispatched here that have
    not produced their first token (each request's prompt minus the prefix the router expected the
    replica to hold); `decoding_requests` = the requests past their first token. `latency` is the
    replica's learned latency model (`router.latency_model`), None when the pool learns none.
    """

    replica_id: str
    url: str
    healthy: bool = True
    draining: bool = False
    breaker_open: bool = False
    inflight_requests: int = 0
    inflight_tokens: int = 0
    max_concurrency: int | None = None
    engine: EngineLoad | None = None
    prefill_tokens_inflight: int = 0
    decoding_requests: int = 0
    latency: LatencyEstimate | None = None
    since_last_token_s: float = 0.0
    """Seconds since the gateway last relayed a streamed token from this replica (any request): the
    phase of the engine step in flight, a TTFT model input (`router.latency_model`); 0 when no
    request decodes there or none has streamed yet."""
    models: frozenset[str] | None = None
    """The client-facing model names this replica serves (its pool's model, declared names, the LoRA
    adapters it lists); None: every name of its pool."""

    def serves(self, model: str) -> bool:
        """True when a request for `model` may run here (`models` None: any name of the pool)."""
        return self.models is None or model in self.models

    @property
    def has_free_slot(self) -> bool:
        """True when the replica is under its per-replica concurrency cap (B_max), or has none."""
        return self.max_concurrency is None or self.inflight_requests < self.max_concurrency


class CapTier(StrEnum):
    """A request's priority class as a learned cap sees it (`RoutingRequest.cap_tier`)."""

    PLAIN = "plain"
    """A middle class, or the only one."""
    TOP = "top"
    """The highest of several classes: may take the place the lowest class holds under a learned cap."""
    LOWEST = "lowest"
    """The lowest of several classes: its requests are counted on the replica (what the top may take)."""


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """What routing needs to know about a request; the body itself never reaches the router.

    `prompt_text` is the canonical prompt (chat messages rendered role-tagged in order, or the
    completion prompt). `exclude` holds replica ids that already failed this request (retries).
    `prefix_hashes` are the chained block hashes of the prompt's prefix and `prefix_key` the hash of its
    first K blocks (both built by `router.keys.build_routing_request`; empty / None when unknown), each
    block `block_size_chars` long. `slo_ttft_s` / `slo_tpot_s` are the request's latency objectives
    (its `x-slo-ttft-ms` / `x-slo-tpot-ms` headers, else the pool's `slo`; None: no bound).
    `model` is the name it is served under (an alias resolved), part of its prefix keys.
    """

    model: str
    prompt_text: str = ""
    estimated_prompt_tokens: int = 0
    max_tokens: int | None = None
    session_key: str | None = None
    exclude: frozenset[str] = field(default_factory=frozenset)
    prefix_hashes: tuple[int, ...] = ()
    prefix_key: int | None = None
    block_size_chars: int = 64
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    pinned: bool = False
    """The request may go only to the one replica not in `exclude` (it holds the request's stored state:
    the gateway's Responses state affinity); its decision's branch is `pinned`, whatever the policy."""
    cap_share: float = 1.0
    """The share of a replica's learned cap this request may fill (1.0; less for the lowest priority
    class while the classes above have demand: `admission.lowest_class_reserve`; more for a waiter at
    its deadline: the gateway's `PoolAdmission.try_at_deadline`): the gateway builds the replicas'
    views for this request with it."""
    cap_tier: CapTier = CapTier.PLAIN
    """Where the request's priority class stands for a learned cap (`CapTier`; `PLAIN` with a single
    class): the lowest class's requests are counted on the replica they run on, the top class may run
    above a learned cap by that count (`admission.lowest_class_reserve`, "The top class")."""
    lora_adapter: bool = False
    """`model` is a LoRA adapter (one a replica lists with a parent, or the pool may load): routing keeps
    it off replicas whose LoRA slots are full of other adapters (`router.lora`)."""

    @property
    def borrows_lowest_place(self) -> bool:
        """The top of several classes: it may run above a learned cap by the lowest class's requests
        there (`CapTier.TOP`; the one test routing views and admission's blocked count share)."""
        return self.cap_tier is CapTier.TOP

    @property
    def estimated_total_tokens(self) -> int:
        """Prompt tokens plus the requested output budget (0 when the client set none)."""
        return self.estimated_prompt_tokens + (self.max_tokens or 0)

    def uncached_tokens(self, matched_blocks: int | None) -> int:
        """Prompt tokens left to prefill when a replica holds `matched_blocks` leading blocks:
        max(0, prompt − matched × block_size_chars / 4); the whole prompt when unknown (None)."""
        if not matched_blocks:
            return self.estimated_prompt_tokens
        cached = matched_blocks * self.block_size_chars // CHARS_PER_TOKEN
        return max(0, self.estimated_prompt_tokens - cached)


class RouteDetail(TypedDict, total=False):
    """What a picker says of its choice beyond the generic fields of `Decision`: each key is set only by
    the pickers that know it (absent: the policy does not say). A new mapping per decision, not changed
    once the decision is made.

    - `hops`: preferences passed over before the one taken — ring members walked past the key's owner
      (`bounded-ring`, `ring`), or candidates passed in `sticky-prefix`'s preference order (also
      `predicted-latency`'s while its models are cold); the header shows 0 when it is absent;
    - `matched_prefix_blocks`: leading blocks of the request the chosen replica is believed to hold
      (every picker that keeps a prefix index: `router.indexed_picker.IndexedPicker`);
    - `shared_prefix_blocks` / `common_prefix_blocks`: the longest and the shortest match of the
      request's prefix over the whole pool, chosen or not (the same pickers). The blocks between the two
      are held by some replicas and not others: what the choice of replica wins or loses, whatever this
      decision did (`gateway.upstream.replica_cost`'s affinity share);
    - `predicted_ttft_s` / `predicted_tpot_s`: the chosen replica's predicted latencies
      (`predicted-latency` once a candidate's TTFT model is warm; TPOT only once one's TPOT model is).
    """

    hops: int
    matched_prefix_blocks: int
    shared_prefix_blocks: int
    common_prefix_blocks: int
    predicted_ttft_s: float
    predicted_tpot_s: float


@dataclass(frozen=True, slots=True)
class Decision:
    """The chosen replica and the reason: the generic fields every policy fills, and its `detail`.

    `candidates` counts the candidates the picker chose among (after eligibility and the profile's
    filters). `detail` is the picker's own account (`RouteDetail`); it is left out of the hash.
    """

    replica_id: str
    policy: str
    branch: Branch
    candidates: int = 0
    detail: RouteDetail = field(default_factory=RouteDetail, hash=False)

    def header_value(self) -> str:
        """Render for the `x-gateway-route` header: `policy=…; branch=…; hops=…[; prefix_blocks=…]
        [; predicted_ttft_ms=…][; predicted_tpot_ms=…]` (hops 0 when the picker reports none; the
        bracketed parts only when the detail holds them)."""
        detail = self.detail
        value = f"policy={self.policy}; branch={self.branch}; hops={detail.get('hops', 0)}"
        matched = detail.get("matched_prefix_blocks")
        if matched is not None:
            value += f"; prefix_blocks={matched}"
        ttft = detail.get("predicted_ttft_s")
        if ttft is not None:
            value += f"; predicted_ttft_ms={ttft * 1000:.0f}"
        tpot = detail.get("predicted_tpot_s")
        if tpot is not None:
            value += f"; predicted_tpot_ms={tpot * 1000:.1f}"
        return value
