"""Settings of a disaggregated pool (`pools[].disaggregation`): a prefill and a decode replica set and
the wire protocol between them (the pool's legs: gateway/proxy/disagg/pair.py).

    disaggregation:
      protocol: vllm | sglang
      prefill: {replicas: <ReplicaSources>, max_concurrency_per_replica: N, policy: prefix-index}
      decode:  {replicas: <ReplicaSources>, max_concurrency_per_replica: N, policy: least-load}
      sglang:  {bootstrap_port: null}

Each set has its own replicas (static, DNS or Kubernetes, as `pools[].replicas`), cap and routing
policy (a preset name; `custom` profiles are not available per set). Defaults: the prefill set routes
by prefix cache (`prefix-index`: the replica that holds the prompt's blocks computes the least), the
decode set by load (`least-load`: fewest requests in flight, then the engine's queue). Everything else
of the pool (timeouts, retries, breaker, attribution, health, scrape, SLO, `policy_options` — the
routing key, which both sets share) applies to each set. With `disaggregation`, the pool's own
`replicas`, `policy` and `max_concurrency_per_replica` are not used and are refused: they are the
decode set's (the registry's client-facing pool is the decode set). A stream broken after its first
byte is continued as on any pool (`continuation`): a new prefill leg for the text so far, then a decode
on another decode replica. `autoscale` applies to each set: each gets its own signal
(`llm_gateway_desired_replicas{pool}`, the prefill set's `pool` label `<model>/prefill`), the prefill
set's batch cap its own `max_concurrency_per_replica` (else `autoscale.b_max`, else the decode set's).

`sglang.bootstrap_port`: the port each prefill replica's bootstrap server listens on
(`--disaggregation-bootstrap-port`); None (default): asked once per prefill replica from its
`GET /get_server_info` (`disaggregation_bootstrap_port`), the engine's own answer.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.config.discovery_settings import ReplicaSources
from router.presets import PolicyContext, build_policy, known_policies

DEFAULT_PREFILL_POLICY = "prefix-index"
DEFAULT_DECODE_POLICY = "least-load"
POOL_KEYS_OF_THE_SETS = ("replicas", "policy", "max_concurrency_per_replica")
"""Pool keys a disaggregated pool takes per set instead (`disaggregation.prefill` / `.decode`)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReplicaSetSettings(_Strict):
    """One side of a disaggregated pool: its replicas, cap per replica and routing policy."""

    replicas: ReplicaSources
    max_concurrency_per_replica: int | None = Field(None, ge=1)
    policy: str | None = None
    """A preset name; None: `prefix-index` for prefill, `least-load` for decode."""

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, name: str | None) -> str | None:
        known = known_policies()
        if name is not None and name not in known:
            raise ValueError(
                f"unknown policy {name!r} (a replica set takes a preset); known: {', '.join(known)}"
            )
        return name


class SglangSettings(_Strict):
    bootstrap_port: int | None = Field(None, ge=1, le=65535)


class DisaggregationSettings(_Strict):
    """`pools[].disaggregation` (module docstring)."""

    protocol: Literal["vllm", "sglang"]
    prefill: ReplicaSetSettings
    decode: ReplicaSetSettings
    sglang: SglangSettings = Field(default_factory=SglangSettings)

    @property
    def prefill_policy(self) -> str:
        return self.prefill.policy or DEFAULT_PREFILL_POLICY

    @property
    def decode_policy(self) -> str:
        return self.decode.policy or DEFAULT_DECODE_POLICY


def fill_pool_from_decode(raw: Any) -> Any:
    """A raw pool with `disaggregation`: refuse the pool-level keys the sets replace (naming them), then
    give the pool the decode set's `replicas`, `policy` and `max_concurrency_per_replica`. A raw pool
    without it must have `replicas`. Runs before field validation (`PoolSettings`)."""
    if not isinstance(raw, dict):
        return raw
    disagg = raw.get("disaggregation")
    if disagg is None:
        if "replicas" not in raw:
            raise ValueError("replicas: required (or configure the pool's disaggregation)")
        return raw
    clashing = [key for key in POOL_KEYS_OF_THE_SETS if key in raw]
    if clashing:
        raise ValueError(
            f"{clashing[0]}: not used by a disaggregated pool; set it under disaggregation.prefill and "
            "disaggregation.decode"
        )
    _check_prefill_policy(disagg, raw.get("policy_options"))
    decode = disagg.get("decode") if isinstance(disagg, dict) else None
    if not isinstance(decode, dict):
        return dict(raw, replicas={})  # the field validation names the missing or malformed set
    filled = dict(raw)
    filled["replicas"] = decode.get("replicas", {})
    filled["policy"] = decode.get("policy") or DEFAULT_DECODE_POLICY
    filled["max_concurrency_per_replica"] = decode.get("max_concurrency_per_replica")
    return filled


def _check_prefill_policy(disagg: Any, options: Any) -> None:
    """The prefill set's policy builds with the pool's `policy_options` (the decode set's is checked
    as the pool's own policy); malformed shapes are left to the field validation."""
    prefill = disagg.get("prefill") if isinstance(disagg, dict) else None
    name = prefill.get("policy") if isinstance(prefill, dict) else None
    name = name or DEFAULT_PREFILL_POLICY
    if name not in known_policies() or not isinstance(options, dict | None):
        return
    try:
        build_policy(name, PolicyContext(rng=random.Random(0), options=options or {}, profile=None))
    except (ValueError, KeyError) as exc:
        raise ValueError(f"policy_options (for disaggregation.prefill.policy {name}): {exc}") from None
