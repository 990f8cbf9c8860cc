"""What a benchmark fleet runs: the mock engines' command-line flags and the gateway's generated config.

- Engines get the flags of `EngineOptions`: only those that are set are passed, so the launcher works
  with the fixed-delay core (`--first-token-delay-ms`, `--token-delay-ms`) and with the physics core
  (`--core physics --profile NAME --speed S`) alike.
- The gateway config is a template (`gateway_config`, YAML) or generated: the launcher sets the server
  address and points the pool of the served model at the engines it started; `policy` and
  `pool_overrides` then override the pool's keys (a mapping is merged into the pool's mapping key by
  key, `merge_into`: `{"continuation": {"enabled": False}}` keeps the template's other continuation
  keys), and `extra_pools` are appended as given. With Redis state and no `key_prefix` of its own, the
  config gets the fleet's fresh prefix.
- Disaggregated (`GatewayOptions.disagg`, bench/disagg.py): the first P engines get `--role prefill`,
  the other D `--role decode` (same core, profile and speed), and the pool gets `disaggregation:` with
  the two sets instead of `replicas:`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.disagg import DisaggSpec, disaggregate


@dataclass(frozen=True, slots=True)
class EngineOptions:
    model: str = "bench-model"
    core: str | None = None
    profile: str | None = None
    speed: float | None = None
    first_token_delay_ms: float | None = None
    token_delay_ms: float | None = None
    seed: int = 0
    extra_args: tuple[str, ...] = ()

    def argv(self, port: int, replica: int) -> list[str]:
        args = ["-m", "mock_engine", "--host", "127.0.0.1", "--port", str(port), "--model", self.model]
        args += ["--seed", str(self.seed + replica)]
        optional = {
            "--core": self.core,
            "--profile": self.profile,
            "--speed": self.speed,
            "--first-token-delay-ms": self.first_token_delay_ms,
            "--token-delay-ms": self.token_delay_ms,
        }
        for flag, value in optional.items():
            if value is not None:
                args += [flag, str(value)]
        return [*args, *self.extra_args]


@dataclass(frozen=True, slots=True)
class GatewayOptions:
    config_path: str | None = None
    policy: str | None = None
    pool_overrides: dict[str, Any] = field(default_factory=dict)
    extra_pools: tuple[dict[str, Any], ...] = ()
    log_level: str = "warning"
    disagg: DisaggSpec | None = None
    """A disaggregated fleet (bench/disagg.py): engine roles and the pool's `disaggregation` section."""
    settings_overrides: dict[str, Any] = field(default_factory=dict)
    """Top-level keys of the gateway config (`--gateway-set`, a variant's `@KEY=YAML`), merged like
    `pool_overrides`: `{"state": {"backend": "redis"}}`."""
    instances: int | None = None
    """Gateway processes of this entry (a variant's `@instances=N`); None: the fleet's `gateways`."""


def gateway_config(
    options: GatewayOptions,
    model: str,
    engine_urls: list[str],
    port: int,
    state_key_prefix: str | None = None,
) -> dict[str, Any]:
    """The gateway's config: the template (or a minimal one) with `settings_overrides`, aimed at
    `engine_urls` on `port`; with Redis state and no `key_prefix` of its own, `state_key_prefix`."""
    raw: dict[str, Any] = {}
    if options.config_path:
        loaded = yaml.safe_load(Path(options.config_path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{options.config_path}: top level must be a mapping")
        raw = loaded
    merge_into(raw, options.settings_overrides)
    state = raw.get("state")
    if isinstance(state, dict) and state.get("backend") == "redis" and state_key_prefix is not None:
        raw["state"] = {"key_prefix": state_key_prefix, **state}
    server = dict(raw.get("server") or {})
    server.update({"host": "127.0.0.1", "port": port})
    server.setdefault("drain_timeout_s", 1)
    raw["server"] = server
    pools = [dict(p) for p in raw.get("pools") or []]
    target = next((p for p in pools if p.get("model") == model), pools[0] if pools else None)
    if target is None:
        target = {"engine": "vllm"}
        pools.append(target)
    target["model"] = model
    target["replicas"] = {"static": engine_urls}
    if options.policy:
        target["policy"] = options.policy
    merge_into(target, options.pool_overrides)
    if options.disagg is not None:
        disaggregate(target, options.disagg, engine_urls)
    raw["pools"] = pools + [dict(p) for p in options.extra_pools]
    return raw


def merge_into(base: dict[str, Any], changes: dict[str, Any]) -> None:
    """Set `changes` into `base`, merging a mapping into an existing mapping key by key (recursively)."""
    for key, value in changes.items():
        current = base.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            merged = dict(current)
            merge_into(merged, value)
            base[key] = merged
        else:
            base[key] = value
