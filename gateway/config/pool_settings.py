"""Settings of one pool (`pools[]` in the config): replicas, policy, caps, timers, retries, breaker,
health checks, engine scraping, SLO and the autoscaling signal. Validated with the rest of the config
by `gateway.config.settings`; every model forbids unknown keys. The SLO and its burn-rate alerts are
`gateway.config.slo_settings`.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field, field_validator, model_validator

from gateway.config.disagg_settings import DisaggregationSettings, fill_pool_from_decode
from gateway.config.discovery_settings import ReplicaSources
from gateway.config.engine_flavours import (
    CONTINUING_ENGINES,
    ENDPOINTS_BY_ENGINE,
    EngineFlavour,
    ServedEndpoint,
)
from gateway.config.latency_settings import LatencyModelSettings, PrefixWaitSettings
from gateway.config.model_settings import ServedModelSettings
from gateway.config.scrape_settings import ScrapeSettings
from gateway.config.slo_settings import SloSettings
from gateway.config.strict_model import StrictModel
from router.keys import KeySettings
from router.presets import CUSTOM_POLICY, PolicyContext, build_policy, known_policies
from router.profile_spec import build_profile


class TimeoutSettings(StrictModel):
    """Upstream timers. `ttft_s` bounds the wait for response headers / the first content chunk."""

    connect_s: float = Field(2.0, gt=0)
    ttft_s: float = Field(15.0, gt=0)
    idle_s: float = Field(30.0, gt=0)
    total_s: float | None = Field(None, gt=0)
    nonstream_s: float = Field(600.0, gt=0)
    """Bound on a non-streaming upstream response: the engine sends nothing until it has finished."""
    max_ttft_s: float = Field(120.0, gt=0)
    """Ceiling for the per-request `x-gateway-ttft-timeout-ms` override."""
    max_idle_s: float = Field(300.0, gt=0)
    """Ceiling for the per-request `x-gateway-idle-timeout-ms` override."""


class RetrySettings(StrictModel):
    """Retries happen only before the first byte (see `gateway.proxy.retry_policy`).

    `max_attempts` counts the first try. The budget allows `budget_ratio` × requests plus
    `budget_min_per_s` retries per second over a 10 s window. Backoff is full jitter:
    uniform(0, min(backoff_max_s, backoff_initial_s × 2^(retry − 1))). Requests whose estimated size
    (prompt + max_tokens) exceeds `max_retry_tokens` are never retried automatically.
    """

    max_attempts: int = Field(3, ge=1, le=10)
    budget_ratio: float = Field(0.1, ge=0, le=1)
    budget_min_per_s: float = Field(0.5, ge=0)
    backoff_initial_s: float = Field(0.025, ge=0)
    backoff_max_s: float = Field(1.0, ge=0)
    max_retry_tokens: int = Field(32768, ge=0)


class BreakerSettings(StrictModel):
    """Per-replica circuit breaker (`gateway.upstream.breaker`), with the pool's ejection budget and
    panic mode (Envoy's outlier-detection anchors).

    Only failures charged to the replica open a breaker (see `AttributionSettings`). At most
    `max_ejected_ratio` of the pool's replicas may be ejected (breaker open or half-open) at once —
    floor(ratio × n) with n = every replica of the pool (down and draining ones included), and at least
    one when the pool has two or more (so a lone replica's breaker never opens unless the ratio is 1); a
    breaker that would open beyond the budget stays closed, keeps counting (it opens at its next failure
    once the budget has room) and is counted in `llm_gateway_ejections_refused_total`. When fewer than
    `panic_threshold` × (non-draining replicas) are routable, routing ignores breakers and spreads over
    every replica that is up and not draining (`llm_gateway_pool_panic`,
    `llm_gateway_panic_decisions_total`); 0 turns panic mode off. A replica that refuses connections or
    fails its health check is down, not ejected: it uses none of the budget, and neither rule brings it
    back. Details: `gateway.upstream.registry`, docs/RELIABILITY.md.
    """

    consecutive_failures: int = Field(5, ge=1)
    failure_ratio: float = Field(0.5, gt=0, le=1)
    min_requests: int = Field(20, ge=1)
    window_s: float = Field(10.0, gt=0)
    open_s: float = Field(5.0, gt=0)
    max_open_s: float = Field(60.0, gt=0)
    max_ejected_ratio: float = Field(0.5, ge=0, le=1)
    panic_threshold: float = Field(0.5, ge=0, le=1)


class AttributionSettings(StrictModel):
    """How a failed attempt is charged to its cause: the replica, the request, or load
    (`gateway.proxy.failure_attribution`). Only replica failures count against a breaker.

    A replica "keeps serving other requests" when it answered another request successfully within
    `window_s`. A missed first-token deadline is *load* when the replica's engine reports at least
    `saturated_waiting_requests` waiting or a KV-cache use of at least `saturated_kv_usage_ratio` (fresh
    scrape), or when every routable replica of the pool missed a deadline within `window_s`. A stream
    that went silent past the idle timeout (kind `stream_idle`) is load on the same engine evidence, or
    when every other routable replica silenced another request's stream within `window_s`; it makes a
    poison request only when it repeats on a second replica and neither replica shows load — in one
    request or across identical ones within `window_s` (`gateway.proxy.containment`). A failure of a
    request that ended unserved is held uncharged for `hold_s`: the request's if its fingerprint fails
    the same way on another replica meanwhile, else settled as any pending failure.
    """

    enabled: bool = True
    """False: every failure of a kind the breaker counts is charged to the replica at once, as before
    attribution existed (for comparisons; no poison request is then detected)."""
    window_s: float = Field(60.0, gt=0)
    saturated_waiting_requests: float = Field(1.0, ge=0)
    saturated_kv_usage_ratio: float = Field(0.9, gt=0, le=1)
    hold_s: float = Field(10.0, gt=0)


class QuarantineSettings(StrictModel):
    """Poison-request quarantine (`gateway.proxy.stores.quarantine`): a request that broke two different
    replicas (both kept serving other requests) is answered 422 `request_quarantined` instead of being
    sent to a third, and its fingerprint (model + prompt-bearing fields, hashed) is refused at arrival
    for `ttl_s` (shared through Redis with `state.backend: redis`; at most `max_entries` in memory)."""

    enabled: bool = True
    ttl_s: float = Field(600.0, gt=0)
    max_entries: int = Field(10_000, ge=1)


class HealthCheckSettings(StrictModel):
    """Active health checks: GET `path` (default: the engine flavour's health endpoint) every
    `interval_s`; `unhealthy_threshold` failures in a row take a replica out, `healthy_threshold`
    successes in a row bring it back."""

    enabled: bool = True
    path: str | None = None
    interval_s: float = Field(5.0, gt=0)
    timeout_s: float = Field(2.0, gt=0)
    healthy_threshold: int = Field(2, ge=1)
    unhealthy_threshold: int = Field(2, ge=1)


class AutoscaleSignalSettings(StrictModel):
    """The live autoscaling signal (`llm_gateway_desired_replicas{pool}`; capacity/autoscale*.py).

    `decode_tokens_per_s` is T_dec, one replica's aggregate decode rate at `b_max` concurrent streams
    (from `llm-gateway plan` or a load test); `b_max` defaults to `max_concurrency_per_replica`.
    """

    decode_tokens_per_s: float = Field(gt=0)
    b_max: int | None = Field(None, ge=1)
    ttft_p95_slo_s: float | None = Field(None, gt=0)
    tpot_p95_slo_s: float | None = Field(None, gt=0)
    window_s: float = Field(60.0, gt=0)
    evaluation_period_s: float = Field(15.0, gt=0)
    scale_up_utilisation_ratio: float = Field(0.8, gt=0, le=1)
    scale_down_utilisation_ratio: float = Field(0.6, gt=0, le=1)
    scale_down_cooldown_s: float = Field(300.0, ge=0)
    min_replicas: int = Field(1, ge=0)
    max_replicas: int | None = Field(None, ge=1)
    gateway_instances: int | None = Field(None, ge=1)
    """k, the number of gateway instances that share this pool's traffic behind a load balancer: each
    sees 1/k of the arrivals, so λ is divided by the traffic share 1/k (`gateway.fleet.instance_membership`).
    Default
    None: measured by the instances' membership heartbeat in Redis with `state.backend: redis`, 1 with
    memory state. Set it with memory state when several instances serve the pool; a value set here is
    used as it is with Redis too."""


class CostSettings(StrictModel):
    """What one replica of the pool costs, for the live cost per goodput token
    (gateway/fleet/alert_rules_cost.py): pool USD/s = replicas × `gpus_per_replica` × `gpu_usd_per_hour`
    / 3600, where replicas is the pool's `llm_gateway_replicas` (every state: a down or draining pod
    still holds its GPUs)."""

    gpu_usd_per_hour: float = Field(gt=0)
    gpus_per_replica: int = Field(1, ge=1)


class ContinuationSettings(StrictModel):
    """Mid-stream continuation (`gateway.proxy.continuation`): a stream whose replica breaks after the
    first byte goes on from another replica, at most `max_resumes` times per request; a continuation
    does not draw from the retry budget (it moves a stream already admitted). On a disaggregated pool a
    continuation is a new prefill leg for the text so far, then a decode on another decode replica.
    `enabled` None (default): on for the engine flavours that continue a trailing assistant message
    (vllm, sglang, llamacpp), off for tgi and openai."""

    enabled: bool | None = None
    max_resumes: int = Field(1, ge=0, le=10)


class PoolSettings(StrictModel):
    model: str = Field(min_length=1)
    upstream_model: str | None = None
    terminating_grace_s: float | None = Field(None, gt=0)
    """When discovery reports an endpoint terminating (Kubernetes), treat it as a preemption notice
    with this deadline — the pods' `terminationGracePeriodSeconds`: what still runs on it 2 s before is
    moved to other replicas (`gateway.proxy.preemption`). None: it is drained only."""
    engine_api_key_env: str | None = None
    """The environment variable holding the key sent to this pool's engines (`Authorization: Bearer`,
    e.g. vLLM's `--api-key`) on proxied requests; the client's own `Authorization` is never forwarded.
    None: no key. Read once at start; a name set here but missing from the environment fails the start."""
    engine: EngineFlavour = "vllm"
    replicas: ReplicaSources
    """`static: [urls]`, or one dynamic source: `dns: {name, port, refresh_s}` or
    `kubernetes: {namespace, service | selector, port, ...}` (gateway/config/discovery_settings.py)."""
    policy: str = "prefix-index"
    """The default because it is best or equal-best in TTFT, throughput and SLO goodput on every
    workload with shared prefixes, near an oracle's cache hit ratio, and on a par with least-load
    without sharing (docs/BENCHMARKS.md, "Routing"). Its index is per gateway instance: with
    several instances and no session stickiness in front, `prefix-affinity` places keys identically
    everywhere and is the better choice (the Kubernetes example uses it). `custom` routes by `profile`."""
    policy_options: dict[str, Any] = Field(default_factory=dict)
    profile: dict[str, Any] | None = None
    """With `policy: custom` (and only then): `{filters: [...], scorers: [...], picker: {...}}`, each entry
    `{type: <plugin type>, <option>: <value>}` (router/plugins.py lists the types and their options;
    examples/custom-profile.yaml). `policy_options` then holds only the routing-key options."""
    max_concurrency_per_replica: int | None = Field(None, ge=1)
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    retries: RetrySettings = Field(default_factory=RetrySettings)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    attribution: AttributionSettings = Field(default_factory=AttributionSettings)
    quarantine: QuarantineSettings = Field(default_factory=QuarantineSettings)
    continuation: ContinuationSettings = Field(default_factory=ContinuationSettings)
    health: HealthCheckSettings = Field(default_factory=HealthCheckSettings)
    scrape: ScrapeSettings = Field(default_factory=ScrapeSettings)
    slo: SloSettings = Field(default_factory=SloSettings)
    cost: CostSettings | None = None  # GPU price: the cost per goodput token rules (`llm-gateway alerts`)
    autoscale: AutoscaleSignalSettings | None = None
    """Off unless configured: the signal needs the replica's measured decode rate."""
    latency_model: LatencyModelSettings = Field(default_factory=LatencyModelSettings)
    """The per-replica latency model learned online and the batch cap it finds
    (gateway/config/latency_settings.py)."""
    prefix_wait: PrefixWaitSettings = Field(default_factory=PrefixWaitSettings)  # latency_settings.py
    endpoints: list[ServedEndpoint] | None = None
    """The endpoints this pool's engine serves (`ENDPOINTS_BY_ENGINE` when None); a request for another
    is a 404 `endpoint_not_served` naming the pool."""
    disaggregation: DisaggregationSettings | None = (
        None  # prefill/decode sets: gateway/config/disagg_settings.py
    )
    models: ServedModelSettings = Field(default_factory=ServedModelSettings)
    """Other models and LoRA adapters the replicas serve, declared or discovered (model_settings.py)."""
    fallback: list[str] = Field(default_factory=list)
    """Client-facing models of other pools tried in order when this pool refuses a request with
    `no_replica` or `queue_full` before a byte was sent (gateway/proxy/fallback.py)."""
    _sets_replace_pool_keys = model_validator(mode="before")(fill_pool_from_decode)

    @property
    def learns_cap(self) -> bool:
        """The pool learns a per-replica cap from the TPOT objective (`latency_model.enabled` and
        `adaptive_cap`, with `slo.tpot_s`): `gateway.upstream.tpot_limit`."""
        latency = self.latency_model
        return latency.enabled and latency.adaptive_cap and bool(self.slo.tpot_s)

    @property
    def continues_streams(self) -> bool:
        """Whether broken streams of this pool are continued on another replica."""
        enabled = self.continuation.enabled
        if enabled is None:
            enabled = self.engine in CONTINUING_ENGINES
        return enabled and self.continuation.max_resumes > 0

    @property
    def served_endpoints(self) -> frozenset[str]:
        """`endpoints`, or the engine flavour's default (`ENDPOINTS_BY_ENGINE`)."""
        if self.endpoints is not None:
            return frozenset(self.endpoints)
        return ENDPOINTS_BY_ENGINE[self.engine]

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        known = [*known_policies(), CUSTOM_POLICY]
        if name not in known:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(known)}")
        return name

    @model_validator(mode="after")
    def _autoscale_has_b_max(self) -> PoolSettings:
        if (
            self.autoscale is not None
            and self.autoscale.b_max is None
            and self.max_concurrency_per_replica is None
        ):
            raise ValueError("autoscale.b_max: set it, or max_concurrency_per_replica")
        return self

    @model_validator(mode="after")
    def _valid_policy_options(self) -> PoolSettings:
        """Build the policy once so a bad `policy_options` entry or `profile` fails at start, naming it."""
        if (self.policy == CUSTOM_POLICY) != (self.profile is not None):
            raise ValueError(f"profile: set it with policy: {CUSTOM_POLICY}, and only then")
        if self.profile is not None:
            build_profile(CUSTOM_POLICY, self.profile, random.Random(0))
        ctx = PolicyContext(rng=random.Random(0), options=self.policy_options, profile=self.profile)
        try:
            build_policy(self.policy, ctx)
            KeySettings.from_options(self.policy_options)
        except (ValueError, KeyError) as exc:
            raise ValueError(f"policy_options: {exc}") from None
        return self
