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
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from core.redaction import redact
from core.shared_state import DEFAULT_TIMEOUT_S as DEFAULT_REDIS_TIMEOUT_S
from gateway.config.admission_settings import AdmissionSettings, TenantSettings
from gateway.config.engine_flavours import EngineFlavour
from gateway.config.model_names import check_model_names
from gateway.config.observability_settings import AccessLogSettings, TracingSettings
from gateway.config.pool_settings import (
    AutoscaleSignalSettings,
    BreakerSettings,
    HealthCheckSettings,
    PoolSettings,
    RetrySettings,
    TimeoutSettings,
)
from gateway.config.slo_settings import SloSettings
from gateway.config.strict_model import StrictModel

__all__ = [
    "AccessLogSettings",
    "AdminSettings",
    "AdmissionSettings",
    "AutoscaleSignalSettings",
    "BreakerSettings",
    "ConfigError",
    "EngineFlavour",
    "HealthCheckSettings",
    "IdempotencySettings",
    "PoolSettings",
    "RetrySettings",
    "ServerSettings",
    "Settings",
    "SloSettings",
    "StateSettings",
    "TenantSettings",
    "TimeoutSettings",
    "TracingSettings",
    "UpstreamClientSettings",
    "load_settings",
    "parse_settings",
]

ENV_PREFIX = "LLM_GATEWAY__"
CONFIG_PATH_ENV = "LLM_GATEWAY_CONFIG"


class ConfigError(ValueError):
    """A configuration problem; the message names the key (and never a credential: `core.redaction`)."""

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


class ServerSettings(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0)
    drain_timeout_s: float = Field(30.0, ge=0)
    readiness_propagation_s: float = Field(5.0, gt=0)
    """How long load balancers take to stop sending after /readyz fails (readiness period × failure
    threshold): the `Retry-After` of a `draining` answer."""
    header_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    """Seconds a client has to complete a request's headers, from the connection's opening (or the
    first byte of a later request on a kept-alive one): a silent connection is closed, half-sent headers
    get 408 `request_timeout` and the connection is closed (`gateway.api.connection_guard`)."""
    body_timeout_s: float = Field(60.0, gt=0, allow_inf_nan=False)
    """Seconds a client has to send the whole request body once its headers are in (a total, so a body
    trickled a byte at a time ends too): 408 `request_timeout`, connection closed."""
    write_timeout_s: float = Field(30.0, gt=0, allow_inf_nan=False)
    """Seconds a response may make no progress towards a client that stopped reading (on Linux under
    `serve`: nothing acknowledged while bytes wait; elsewhere: one write blocked on full buffers): the
    request ends as a client disconnect, its upstream request is closed, the connection is reset."""
    min_read_bytes_per_s: float = Field(1024.0, ge=0, allow_inf_nan=False)
    """Bytes per second a client must take, averaged over `write_timeout_s`, while it holds a response
    back (on Linux under `serve`: the kernel has bytes it cannot send yet at every sample): a slower
    reader ends like one that stopped (phase `slow_read`). Far under a mobile link's rate; 0 turns the
    rule off. Elsewhere only the write deadline bounds a slow reader (a write blocked on full buffers;
    under uvicorn one waits for 48 KB to drain)."""
    max_connections: int = Field(8192, ge=1)
    """Open client connections (at most half the process's file limit is used; the rest is for upstream
    connections). Over it a new connection closes the one silent longest (nothing sent for 1 s), else
    its request gets 503 `connection_limit` with Retry-After; past 1.25 × it a new connection is closed
    as soon as it is accepted."""
    workers: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    """Gateway processes serving the one address (`gateway.ops.workers`): each a full gateway
    that counts as one instance. 1 (default): one process, no supervisor. `auto`: one per usable core
    (`os.sched_getaffinity`, else `os.cpu_count()`). With more than 1, caps, rate limits, the prefix
    index, quarantine, idempotency and response state are shared as across instances: through the
    configured Redis with `state.backend: redis`; with memory state through a local state server the
    supervisor runs (`gateway.ops.local_state`: a `valkey-server` on a private Unix socket).
    `max_connections` and the file limit apply to each worker."""

    def worker_count(self) -> int:
        """The number of worker processes `workers` stands for on this host (`auto`: usable cores)."""
        if self.workers != "auto":
            return self.workers
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - no sched_getaffinity (macOS)
            return max(1, os.cpu_count() or 1)


class UpstreamClientSettings(StrictModel):
    """The one shared HTTP client per process."""

    max_connections: int = Field(1024, ge=1)
    """Upper bound on open connections to all replicas together (idle ones are kept alive); a
    disaggregated pool's request holds two (prefill and decode) and is dispatched only when both fit."""
    keepalive_expiry_s: float = Field(30.0, gt=0)


class StateSettings(StrictModel):
    backend: Literal["memory", "redis"] = "memory"
    """Where shared state lives: `memory` (default; each instance alone) or the Redis at `url`. With
    `memory` and `server.workers` > 1 the workers share a local state server the supervisor runs
    (`gateway.ops.local_state`), and every `state:` setting but `url` applies as with Redis."""
    url: str = "redis://127.0.0.1:6379/0"
    on_error: Literal["fail_open", "fail_closed"] = "fail_open"
    timeout_s: float = Field(DEFAULT_REDIS_TIMEOUT_S, gt=0, le=30, allow_inf_nan=False)
    """Socket connect and read timeout of each Redis call (default 0.25 s); a call also gives up after
    4 x this in total. Past it the call counts as Redis unreachable and `on_error` answers. Short because
    admission waits on it; raise it for a Redis across zones or on a heavily loaded host. Keep 4 x this
    well under `replica_lease_ttl_s` / 3 (and `idempotency.lease_s` / 3), the renewal periods: a
    renewal slower than that lets a held slot credit or claim lapse. Ignored with `backend: memory` and
    one worker."""
    key_prefix: str = Field("llm-gateway:", min_length=1)
    """Prefix of every Redis key: deployments (or tests) sharing one Redis keep apart by it."""
    replica_lease_ttl_s: float = Field(10.0, gt=0)
    """Expiry of a replica slot credit unless renewed (every ttl / 3): how long the slots held by a
    gateway that died without releasing them stay taken (`gateway.upstream.slot_credits`). The same
    ttl (and ttl / 3 heartbeat) bounds how long a dead gateway still counts as a live instance for the
    autoscaling signal's traffic share (`gateway.fleet.instance_membership`)."""
    replica_credit_linger_s: float = Field(1.0, gt=0)
    """How long an idle replica slot credit stays with this gateway before it goes back to Redis."""
    share_prefix_index: bool = True
    """With `backend: redis`: every pool whose policy keeps a prefix index (`prefix-index`, `sticky-prefix`,
    `predicted-latency`, a custom profile with such a picker) exchanges its routing records (replica id
    and block hashes, never text) with the other instances, so each routes on the whole fleet's traffic
    (`gateway.fleet.prefix_sharing`). false: each instance sees only its own. Ignored with memory state
    and one worker (several workers on memory state exchange them through the local state server)."""


DEFAULT_IDEMPOTENCY_TTL_S = 600.0
DEFAULT_IDEMPOTENCY_LEASE_S = 10.0
DEFAULT_IDEMPOTENCY_MAX_STORED_BYTES = 1 << 20


class IdempotencySettings(StrictModel):
    """`Idempotency-Key` on non-streaming requests (`gateway.proxy.stores.idempotency`): kept in memory per
    instance, or in Redis across instances with `state.backend: redis` (and across several workers on
    memory state, in their local state server)."""

    ttl_s: float = Field(DEFAULT_IDEMPOTENCY_TTL_S, gt=0, allow_inf_nan=False)
    """Seconds (default 600) a completed response is replayed to duplicates, counted from its completion.
    Past it the entry is gone: the same key runs again as a new request, with any body (in memory the
    oldest of 10,000 entries also goes early when a new key needs room)."""
    lease_s: float = Field(DEFAULT_IDEMPOTENCY_LEASE_S, gt=0, allow_inf_nan=False)
    """Shared state only (Redis, or several workers' local state server). Seconds (default 10) a running
    leader's claim lasts unless renewed; it is renewed every lease / 3 while the request runs. When a
    gateway dies mid-request, the lease runs out and the next duplicate (on any instance) runs instead
    of waiting: at most this long after the death."""
    max_stored_bytes: int = Field(DEFAULT_IDEMPOTENCY_MAX_STORED_BYTES, gt=0)
    """Bytes (default 1048576 = 1 MiB) of the largest response stored for replay: headers + body (in
    Redis as stored: headers as JSON, a non-UTF-8 body as base64). A larger response is still answered
    but not stored (logged): waiting and later duplicates run again, as after a failed leader."""


class AdminSettings(StrictModel):
    """The admin API is served only when the named environment variable holds a key."""

    api_key_env: str = "LLM_GATEWAY_ADMIN_KEY"


class Settings(StrictModel):
    server: ServerSettings = Field(default_factory=ServerSettings)
    pools: list[PoolSettings] = Field(default_factory=list)
    upstream: UpstreamClientSettings = Field(default_factory=UpstreamClientSettings)
    state: StateSettings = Field(default_factory=StateSettings)
    idempotency: IdempotencySettings = Field(default_factory=IdempotencySettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    tenants: list[TenantSettings] = Field(default_factory=list)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    access_log: AccessLogSettings = Field(default_factory=AccessLogSettings)
    seed: int | None = None
    model_aliases: dict[str, str] = Field(default_factory=dict)
    """Client-facing names that stand for a served one (`{alias: model}`): a request for the alias is
    served as a request for the model (its pool, queue, prefix key; the body's model rewritten). The
    target is a pool's `model` or one of its `models.names` (or, with a pool that has `models.discover`,
    an adapter a replica lists); an alias may not shadow a served name."""

    @model_validator(mode="after")
    def _unique_models(self) -> Settings:
        check_model_names(self.pools, self.model_aliases)
        names = [tenant.name for tenant in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenants: names must be unique")
        for tenant in self.tenants:
            if tenant.priority_ceiling is not None and tenant.priority_ceiling not in self.admission.classes:
                raise ValueError(
                    f"tenants: {tenant.name}: priority_ceiling {tenant.priority_ceiling!r} is not a class"
                )
        if self.upstream.max_connections < 2 and any(p.disaggregation for p in self.pools):
            raise ValueError("upstream.max_connections: a disaggregated pool's request holds 2; at least 2")
        return self


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
