from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import ConfigError, IdempotencySettings, load_settings, parse_settings

MINIMAL = {"pools": [{"model": "m", "replicas": {"static": ["http://127.0.0.1:8101"]}}]}


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
def test_errors_name_the_offending_key(raw: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(raw)
    assert key in str(info.value)


def test_duplicate_models_are_refused() -> None:
    pools = [MINIMAL["pools"][0], MINIMAL["pools"][0]]
    with pytest.raises(ConfigError, match="more than one pool"):
        parse_settings({"pools": pools})


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


def test_the_readme_configuration_block_is_valid() -> None:
    import yaml

    readme = Path(__file__).resolve().parents[3].joinpath("README.md").read_text()
    section = readme.split("## Configuration", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    settings = parse_settings(yaml.safe_load(block))
    assert settings.pools[0].model == "demo-model"
    assert settings.idempotency == IdempotencySettings(), "the block shows the idempotency defaults"


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
def test_bad_idempotency_values_are_refused_by_name(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"idempotency": raw})
    assert message in str(info.value)


def test_idempotency_env_overrides() -> None:
    env = {"LLM_GATEWAY__IDEMPOTENCY__TTL_S": "60", "LLM_GATEWAY__IDEMPOTENCY__LEASE_S": "2.5"}
    idempotency = load_settings(environ=env).idempotency
    assert (idempotency.ttl_s, idempotency.lease_s, idempotency.max_stored_bytes) == (60.0, 2.5, 1 << 20)
    with pytest.raises(ConfigError, match=r"idempotency\.max_stored_bytes"):
        load_settings(environ={"LLM_GATEWAY__IDEMPOTENCY__MAX_STORED_BYTES": "-1"})
