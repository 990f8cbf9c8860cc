"""Validated configuration: one YAML file plus environment overrides.

Sources, later wins:
  1. built-in defaults (the models below),
  2. the YAML file (`--config PATH` or `LLM_GATEWAY_CONFIG`),
  3. environment overrides `LLM_GATEWAY__<KEY>__<SUBKEY>=value` (double underscore nests, keys are
     lower-cased, values parsed as YAML scalars: `LLM_GATEWAY__SERVER__PORT=9000`).

Validation happens once at start; `ConfigError` names the offending key (`pools.0.policy: …`).
Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.upstream.discovery.settings import ReplicaSources
from gateway.upstream.scraper import ScrapeSettings
from router.keys import KeySettings
from router.presets import PolicyContext, build_policy, known_policies

ENV_PREFIX = "LLM_GATEWAY__"
CONFIG_PATH_ENV = "LLM_GATEWAY_CONFIG"


class ConfigError(ValueError):
    """A configuration problem; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0)
    drain_timeout_s: float = Field(30.0, ge=0)
    readiness_propagation_s: float = Field(5.0, gt=0)
    """How long load balancers take to stop sending after /readyz fails (readiness period × failure
    threshold): the `Retry-After` of a `draining` answer."""


class TimeoutSettings(_Strict):
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


class RetrySettings(_Strict):
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


class BreakerSettings(_Strict):
    """Per-replica circuit breaker (`gateway.upstream.breaker`)."""

    consecutive_failures: int = Field(5, ge=1)
    failure_ratio: float = Field(0.5, gt=0, le=1)
    min_requests: int = Field(20, ge=1)
    window_s: float = Field(10.0, gt=0)
    open_s: float = Field(5.0, gt=0)
    max_open_s: float = Field(60.0, gt=0)


class HealthCheckSettings(_Strict):
    """Active health checks: GET `path` (default: the engine flavour's health endpoint) every
    `interval_s`; `unhealthy_threshold` failures in a row take a replica out, `healthy_threshold`
    successes in a row bring it back."""

    enabled: bool = True
    path: str | None = None
    interval_s: float = Field(5.0, gt=0)
    timeout_s: float = Field(2.0, gt=0)
    healthy_threshold: int = Field(2, ge=1)
    unhealthy_threshold: int = Field(2, ge=1)


class AutoscaleSignalSettings(_Strict):
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


class SloSettings(_Strict):
    """The latency objective a request must meet to count as goodput (the field's definition: both
    TTFT and TPOT within bounds). An unset bound always holds."""

    ttft_s: float | None = Field(2.0, gt=0)
    tpot_s: float | None = Field(0.05, gt=0)


EngineFlavour = Literal["vllm", "sglang", "tgi", "llamacpp", "openai"]


class PoolSettings(_Strict):
    model: str = Field(min_length=1)
    upstream_model: str | None = None
    engine: EngineFlavour = "vllm"
    replicas: ReplicaSources
    """`static: [urls]`, or one dynamic source: `dns: {name, port, refresh_s}` or
    `kubernetes: {namespace, service | selector, port, ...}` (gateway/upstream/discovery/settings.py)."""
    policy: str = "least-load"
    policy_options: dict[str, Any] = Field(default_factory=dict)
    max_concurrency_per_replica: int | None = Field(None, ge=1)
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    retries: RetrySettings = Field(default_factory=RetrySettings)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    health: HealthCheckSettings = Field(default_factory=HealthCheckSettings)
    scrape: ScrapeSettings = Field(default_factory=ScrapeSettings)
    slo: SloSettings = Field(default_factory=SloSettings)
    autoscale: AutoscaleSignalSettings | None = None
    """Off unless configured: the signal needs the replica's measured decode rate."""

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        known = known_policies()
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
        """Build the policy once so a bad `policy_options` entry fails at start, naming the option."""
        try:
            build_policy(self.policy, PolicyContext(rng=random.Random(0), options=self.policy_options))
            KeySettings.from_options(self.policy_options)
        except (ValueError, KeyError) as exc:
            raise ValueError(f"policy_options: {exc}") from None
        return self


class UpstreamClientSettings(_Strict):
    """The one shared HTTP client per process."""

    max_connections: int = Field(1024, ge=1)
    """Upper bound on open connections to all replicas together (idle ones are kept alive)."""
    keepalive_expiry_s: float = Field(30.0, gt=0)


class StateSettings(_Strict):
    backend: Literal["memory", "redis"] = "memory"
    url: str = "redis://127.0.0.1:6379/0"
    on_error: Literal["fail_open", "fail_closed"] = "fail_open"
    key_prefix: str = Field("llm-gateway:", min_length=1)
    """Prefix of every Redis key: deployments (or tests) sharing one Redis keep apart by it."""
    replica_lease_ttl_s: float = Field(10.0, gt=0)
    """Expiry of a replica slot credit unless renewed (every ttl / 3): how long the slots held by a
    gateway that died without releasing them stay taken (`gateway.upstream.slot_credits`)."""
    replica_credit_linger_s: float = Field(1.0, gt=0)
    """How long an idle replica slot credit stays with this gateway before it goes back to Redis."""


class PriorityClassSettings(_Strict):
    """One priority class: how long a request may wait in the queue, and an optional depth of its own."""

    max_wait_s: float = Field(gt=0)
    max_depth: int | None = Field(None, ge=1)


def _default_classes() -> dict[str, PriorityClassSettings]:
    return {
        "critical": PriorityClassSettings(max_wait_s=30),
        "interactive": PriorityClassSettings(max_wait_s=10),
        "batch": PriorityClassSettings(max_wait_s=300),
    }


class AdmissionSettings(_Strict):
    """Priority classes are listed highest priority first (YAML keeps the order). A request's class is
    `x-gateway-priority`, clamped to its tenant's ceiling; `default_priority` when absent or unknown.
    With tenants configured, a request without an API key is refused (401) unless `allow_anonymous`."""

    classes: dict[str, PriorityClassSettings] = Field(default_factory=_default_classes)
    max_queue_depth: int = Field(2000, ge=1)
    default_priority: str = "interactive"
    allow_anonymous: bool = False

    @model_validator(mode="after")
    def _default_is_a_class(self) -> AdmissionSettings:
        if not self.classes:
            raise ValueError("classes: at least one priority class is needed")
        if self.default_priority not in self.classes:
            raise ValueError(f"default_priority {self.default_priority!r} is not one of the classes")
        return self


class TenantSettings(_Strict):
    """A tenant: API keys as sha256 hex digests (`llm-gateway hash-key`), limits, ceiling and weight."""

    name: str = Field(min_length=1)
    api_key_hashes: list[str] = Field(default_factory=list)
    requests_per_min: float | None = Field(None, gt=0)
    tokens_per_min: float | None = Field(None, gt=0)
    max_concurrent: int | None = Field(None, ge=1)
    priority_ceiling: str | None = None
    weight: float = Field(1.0, gt=0)

    @field_validator("api_key_hashes")
    @classmethod
    def _hex_digests(cls, hashes: list[str]) -> list[str]:
        for value in hashes:
            if len(value) != 64 or any(ch not in "0123456789abcdefABCDEF" for ch in value):
                raise ValueError("each api_key_hashes entry must be a sha256 hex digest (64 hex characters)")
        return [value.lower() for value in hashes]


class AdminSettings(_Strict):
    """The admin API is served only when the named environment variable holds a key."""

    api_key_env: str = "LLM_GATEWAY_ADMIN_KEY"


class Settings(_Strict):
    server: ServerSettings = Field(default_factory=ServerSettings)
    pools: list[PoolSettings] = Field(default_factory=list)
    upstream: UpstreamClientSettings = Field(default_factory=UpstreamClientSettings)
    state: StateSettings = Field(default_factory=StateSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    tenants: list[TenantSettings] = Field(default_factory=list)
    seed: int | None = None

    @model_validator(mode="after")
    def _unique_models(self) -> Settings:
        seen: set[str] = set()
        for pool in self.pools:
            if pool.model in seen:
                raise ValueError(f"model {pool.model!r} is configured by more than one pool")
            seen.add(pool.model)
        names = [tenant.name for tenant in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenants: names must be unique")
        for tenant in self.tenants:
            if tenant.priority_ceiling is not None and tenant.priority_ceiling not in self.admission.classes:
                raise ValueError(
                    f"tenants: {tenant.name}: priority_ceiling {tenant.priority_ceiling!r} is not a class"
                )
        return self

    def pool_for(self, model: str) -> PoolSettings | None:
        return next((p for p in self.pools if p.model == model), None)


def _format_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        lines.append(f"{key}: {item['msg']}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _set_nested(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node: Any = tree
    for i, part in enumerate(path[:-1]):
        child = node[int(part)] if isinstance(node, list) else node.get(part)
        if child is None:
            child = {}
            node[part] = child
        if not isinstance(child, dict | list):
            raise ConfigError(f"{'.'.join(path[: i + 1])}: cannot override inside a scalar")
        node = child
    last = path[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def apply_env_overrides(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Apply `LLM_GATEWAY__A__B=v` overrides onto the raw config tree (see module docstring)."""
    for name, text in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not path:
            continue
        try:
            _set_nested(raw, path, yaml.safe_load(text))
        except (ValueError, IndexError, KeyError) as exc:
            raise ConfigError(f"{'.'.join(path)}: bad environment override {name}: {exc}") from exc
    return raw


def parse_settings(raw: Mapping[str, Any]) -> Settings:
    """Validate a raw config tree; raises `ConfigError` naming each offending key."""
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


def load_settings(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Load the YAML at `path` (or `$LLM_GATEWAY_CONFIG`), apply env overrides, validate."""
    env = os.environ if environ is None else environ
    config_path = path or env.get(CONFIG_PATH_ENV)
    raw: Any = {}
    if config_path:
        try:
            raw = yaml.safe_load(Path(config_path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {config_path} is not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {config_path}: top level must be a mapping")
    return parse_settings(apply_env_overrides(raw, env))
