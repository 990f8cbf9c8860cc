from __future__ import annotations

import random
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gateway.config.settings import ConfigError, IdempotencySettings, Settings, load_settings, parse_settings
from router.presets import PolicyContext, build_policy
from router.types import EngineLoad, ReplicaView, RoutingRequest

MINIMAL = {"pools": [{"model": "m", "replicas": {"static": ["http://127.0.0.1:8101"]}}]}
CONFIGURATION = Path(__file__).resolve().parents[3] / "docs" / "CONFIGURATION.md"


def documented_config_block() -> str:
    """The commented config of docs/CONFIGURATION.md ("Every key, with its default")."""
    section = CONFIGURATION.read_text().split("## Every key, with its default", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_defaults_fill_a_minimal_config() -> None:
    settings = parse_settings(MINIMAL)
    pool = settings.pools[0]
    assert pool.policy == "prefix-index" and pool.engine == "vllm"
    assert pool.timeouts.ttft_s == 15.0 and pool.retries.max_attempts == 3
    assert settings.state.backend == "memory"


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (
            {"pools": [{"model": "m", "replicas": {"static": ["http://x"]}, "policy": "magic"}]},
            "pools.0.policy",
        ),
        ({"pools": [{"model": "m", "replicas": {"static": ["ftp://x"]}}]}, "pools.0.replicas.static"),
        (
            {"pools": [{"model": "m", "replicas": {"static": []}, "timeouts": {"ttft_s": -1}}]},
            "pools.0.timeouts.ttft_s",
        ),
        ({"server": {"port": "eighty"}}, "server.port"),
        ({"server": {"prot": 1}}, "server.prot"),
        ({"state": {"backend": "etcd"}}, "state.backend"),
        ({"state": {"backend": "redis", "timeout_s": 0}}, "state.timeout_s"),
        ({"state": {"backend": "redis", "timeout_s": 31}}, "state.timeout_s"),
        ({"state": {"backend": "redis", "timeout_s": "nan"}}, "state.timeout_s"),
        (
            {
                "pools": [
                    {
                        "model": "m",
                        "replicas": {"static": []},
                        "policy": "prefix-affinity",
                        "policy_options": {"load_factor": 0.5},
                    }
                ]
            },
            "load_factor",
        ),
    ],
)
def test_errors_name_the_offending_key(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(raw)
    assert key in str(info.value)


def test_duplicate_models_are_refused() -> None:
    pools = [MINIMAL["pools"][0], MINIMAL["pools"][0]]
    with pytest.raises(ConfigError, match="more than one pool"):
        parse_settings({"pools": pools})


def test_a_disaggregated_pool_needs_two_upstream_connections() -> None:
    """A pair request holds a prefill and a decode connection at once: under 2 it could never be sent."""
    pool = {
        "model": "m",
        "disaggregation": {
            "protocol": "vllm",
            "prefill": {"replicas": {"static": ["http://10.0.1.1:8000"]}},
            "decode": {"replicas": {"static": ["http://10.0.2.1:8000"]}},
        },
    }
    with pytest.raises(ConfigError, match=r"upstream\.max_connections.*at least 2"):
        parse_settings({"pools": [pool], "upstream": {"max_connections": 1}})
    assert parse_settings({"pools": [pool], "upstream": {"max_connections": 2}}).pools[0].disaggregation
    single = {"model": "m", "replicas": {"static": ["http://10.0.1.1:8000"]}}
    assert parse_settings({"pools": [single], "upstream": {"max_connections": 1}}).upstream.max_connections


def test_yaml_file_and_env_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "server: {port: 9000}\npools:\n  - model: m\n    replicas: {static: ['http://127.0.0.1:1']}\n"
    )
    env = {
        "LLM_GATEWAY_CONFIG": str(path),
        "LLM_GATEWAY__SERVER__PORT": "9100",
        "LLM_GATEWAY__POOLS__0__POLICY": "round-robin",
    }
    settings = load_settings(environ=env)
    assert settings.server.port == 9100
    assert settings.pools[0].policy == "round-robin"


def test_unreadable_or_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad, environ={})
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(scalar, environ={})


def test_examples_are_valid() -> None:
    examples = sorted(Path(__file__).resolve().parents[3].joinpath("examples").glob("*.yaml"))
    assert examples, "examples/ must hold working configs"
    for example in examples:
        load_settings(example, environ={})


def test_the_documented_configuration_block_is_valid() -> None:
    settings = parse_settings(yaml.safe_load(documented_config_block()))
    assert settings.pools[0].model == "demo-model"
    assert settings.idempotency == IdempotencySettings(), "the block shows the idempotency defaults"


EXAMPLE_VALUED = {"upstream_model", "replicas", "max_concurrency_per_replica"}
"""Pool keys the documented block shows with an example value rather than the default."""
DOCUMENTED_ELSEWHERE = {"disaggregation": "docs/DISAGGREGATION.md"}
"""Settings whose own keys are documented on another page (which its tests read)."""


def test_the_documented_configuration_block_shows_the_defaults() -> None:
    documented = parse_settings(yaml.safe_load(documented_config_block()))
    defaults = parse_settings({"pools": [{"model": "demo-model", "replicas": {"static": ["http://h:1"]}}]})
    for name in type(documented).model_fields:
        if name != "pools":
            assert getattr(documented, name) == getattr(defaults, name), f"{name}: not the default"
    pool, default_pool = documented.pools[0], defaults.pools[0]
    for name in set(type(pool).model_fields) - EXAMPLE_VALUED:
        assert getattr(pool, name) == getattr(default_pool, name), f"pools[].{name}: not the default"


def _setting_names(model: type[BaseModel], path: str = "") -> Iterator[tuple[str, str]]:
    """(path, key) of every setting under `model`, recursively through nested settings models."""
    for name, field in model.model_fields.items():
        yield path + name, name
        if name in DOCUMENTED_ELSEWHERE:
            continue
        for nested in _models_in(field.annotation):
            yield from _setting_names(nested, f"{path}{name}.")


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def test_the_documented_configuration_block_names_every_setting() -> None:
    """A new setting fails here until docs/CONFIGURATION.md's block names it (a key or a comment)."""
    block = documented_config_block()
    missing = [path for path, key in _setting_names(Settings) if not re.search(rf"\b{key}\b", block)]
    assert not missing, f"docs/CONFIGURATION.md does not name: {missing}"


def test_idempotency_defaults_are_the_stores_defaults() -> None:
    idempotency = parse_settings({}).idempotency
    assert (idempotency.ttl_s, idempotency.lease_s, idempotency.max_stored_bytes) == (600.0, 10.0, 1 << 20)
    assert parse_settings({"idempotency": {"ttl_s": 30, "max_stored_bytes": 4096}}).idempotency == (
        IdempotencySettings(ttl_s=30, lease_s=10, max_stored_bytes=4096)
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"ttl_s": 0}, "idempotency.ttl_s: Input should be greater than 0"),
        ({"ttl_s": -5}, "idempotency.ttl_s: Input should be greater than 0"),
        ({"ttl_s": float("inf")}, "idempotency.ttl_s: Input should be a finite number"),
        ({"lease_s": 0}, "idempotency.lease_s: Input should be greater than 0"),
        ({"lease_s": float("nan")}, "idempotency.lease_s: Input should be a finite number"),
        ({"max_stored_bytes": 0}, "idempotency.max_stored_bytes: Input should be greater than 0"),
        ({"max_stored_bytes": "1MiB"}, "idempotency.max_stored_bytes: Input should be a valid integer"),
        ({"max_stored_bytes": 1.5}, "idempotency.max_stored_bytes: Input should be a valid integer"),
        ({"ttl": 60}, "idempotency.ttl: Extra inputs are not permitted"),
    ],
)
def test_bad_idempotency_values_are_refused_by_name(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"idempotency": raw})
    assert message in str(info.value)


def test_idempotency_env_overrides() -> None:
    env = {"LLM_GATEWAY__IDEMPOTENCY__TTL_S": "60", "LLM_GATEWAY__IDEMPOTENCY__LEASE_S": "2.5"}
    idempotency = load_settings(environ=env).idempotency
    assert (idempotency.ttl_s, idempotency.lease_s, idempotency.max_stored_bytes) == (60.0, 2.5, 1 << 20)
    with pytest.raises(ConfigError, match=r"idempotency\.max_stored_bytes"):
        load_settings(environ={"LLM_GATEWAY__IDEMPOTENCY__MAX_STORED_BYTES": "-1"})


CUSTOM_POOL = """
model: m
replicas: {static: ['http://127.0.0.1:8101']}
policy: custom
policy_options: {block_size_chars: 32}
profile:
  filters: [{type: imbalance-guard, imbalance_abs_requests: 4}]
  scorers:
    - {type: kv-usage, weight: 1.0}
    - {type: queue, weight: 0.5}
  picker: {type: max-score}
"""


def custom_pool(**changes: Any) -> dict[str, Any]:
    pool = yaml.safe_load(CUSTOM_POOL)
    for key, value in changes.items():
        if value is None:
            del pool[key]
        else:
            pool[key] = value
    return {"pools": [pool]}


def test_a_custom_profile_from_yaml_routes_as_configured() -> None:
    pool = parse_settings(custom_pool()).pools[0]
    built = build_policy(pool.policy, PolicyContext(random.Random(0), pool.policy_options, pool.profile))
    views = [
        ReplicaView("busy", "http://b", inflight_requests=30),
        ReplicaView("full-cache", "http://f", engine=EngineLoad(kv_usage_ratio=0.9)),
        ReplicaView("empty-cache", "http://e", inflight_requests=1, engine=EngineLoad(kv_usage_ratio=0.1)),
    ]
    decision = built.decide(RoutingRequest(model="m"), views)
    assert decision is not None
    assert (decision.replica_id, decision.policy, decision.candidates) == ("full-cache", "custom", 1)
    assert decision.branch == "single_candidate", "imbalanced: the guard kept only the least loaded"
    calm = [ReplicaView("busy", "http://b", inflight_requests=3), *views[1:]]
    assert (again := built.decide(RoutingRequest(model="m"), calm)) is not None
    assert again.replica_id == "empty-cache", "no imbalance: the KV-usage scorer decides"


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"profile": None}, ["pools.0", "profile", "policy: custom"]),
        ({"policy": "least-load"}, ["pools.0", "profile", "policy: custom"]),
        (
            {"profile": {"scorers": [{"type": "queue"}, {"type": "cache"}], "picker": {"type": "max-score"}}},
            ["pools.0", "profile.scorers.1", "'cache'", "kv-usage"],
        ),
        (
            {"profile": {"picker": {"type": "max-score", "branch": "x"}}},
            ["profile.picker (max-score)", "branch"],
        ),
        (
            {
                "profile": {
                    "filters": [{"type": "load-bound", "load_factor": 0.5}],
                    "picker": {"type": "ring"},
                }
            },
            ["profile.filters.0 (load-bound)", "'load_factor'"],
        ),
        ({"policy_options": {"load_factor": 2}}, ["pools.0", "policy_options", "load_factor"]),
    ],
)
def test_custom_profile_errors_name_the_key(changes: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(custom_pool(**changes))
    for name in names:
        assert name in str(info.value)
