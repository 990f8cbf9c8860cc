"""Top-level gateway settings per entry (`--gateway-set`, a variant's `@KEY=YAML`), the entry's own number
of gateway instances (`@instances=N`) and a fresh Redis key prefix per fleet: what makes "1 instance vs 3
without sharing vs 3 sharing the prefix index" one compare on one Redis."""

from __future__ import annotations

import argparse

import pytest

from bench import commands
from bench.compare_presets import PresetParser
from bench.fleet import Fleet
from bench.fleet_config import EngineOptions, GatewayOptions, gateway_config
from gateway.config.settings import parse_settings

URLS = ["http://127.0.0.1:9101", "http://127.0.0.1:9102"]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = PresetParser()
    commands.add_compare_arguments(parser)
    return parser.parse_args(argv)


def test_variants_set_top_level_keys_and_their_instance_count_beside_the_pools() -> None:
    args = _parse(
        [
            "--gateway-set",
            "state.backend=redis",
            "--gateway-set",
            "state.on_error=fail_open",
            "--variant",
            "one:@instances=1",
            "--variant",
            "three:@instances=3;@state.share_prefix_index=false;max_concurrency_per_replica=8",
            "--variant",
            "plain:",
        ]
    )
    entries = {label: gateway for label, gateway, _ in commands._entries(args)}
    one, three, plain = entries["one"], entries["three"], entries["plain"]
    assert one is not None and three is not None and plain is not None
    assert (one.instances, three.instances, plain.instances) == (1, 3, None)
    assert one.settings_overrides == {"state": {"backend": "redis", "on_error": "fail_open"}}
    assert three.settings_overrides["state"] == {
        "backend": "redis",
        "on_error": "fail_open",
        "share_prefix_index": False,
    }
    assert three.pool_overrides["max_concurrency_per_replica"] == 8
    assert "instances" not in three.pool_overrides and "state" not in three.pool_overrides


@pytest.mark.parametrize("value", ["0", "two", "true", "1.5"])
def test_a_bad_instance_count_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="instances must be an integer >= 1"):
        commands._entries(_parse(["--variant", f"bad:@instances={value}"]))


def test_the_config_gets_the_settings_and_a_key_prefix_only_with_redis_state() -> None:
    options = GatewayOptions(policy="prefix-index", settings_overrides={"state": {"backend": "redis"}})
    raw = gateway_config(options, "m", URLS, 8080, "bench:abc:")
    assert raw["state"] == {"backend": "redis", "key_prefix": "bench:abc:"}
    settings = parse_settings(raw)
    assert settings.state.backend == "redis" and settings.state.share_prefix_index is True
    own = GatewayOptions(settings_overrides={"state": {"backend": "redis", "key_prefix": "mine:"}})
    assert gateway_config(own, "m", URLS, 8080, "bench:abc:")["state"]["key_prefix"] == "mine:"
    assert "state" not in gateway_config(GatewayOptions(), "m", URLS, 8080, "bench:abc:")


def test_each_fleet_has_its_own_key_prefix_and_the_entrys_instance_count() -> None:
    first = Fleet(2, EngineOptions(), GatewayOptions(instances=3), base_port=9000, gateways=1)
    second = Fleet(2, EngineOptions(), GatewayOptions(), base_port=9000, gateways=2)
    assert first.gateway_ports == [9000, 9001, 9002] and first.engine_ports == [9003, 9004]
    assert len(second.gateway_ports) == 2, "without its own count the fleet's applies"
    assert first.state_key_prefix != second.state_key_prefix
    with pytest.raises(ValueError, match="gateway instances"):
        Fleet(1, EngineOptions(), GatewayOptions(instances=0))
