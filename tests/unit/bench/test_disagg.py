"""Disaggregated fleets in the benchmark (`--disagg [LABEL=]P:D[@LINK]`): the option's parsing, the
engines' roles, the generated gateway pool (accepted by the gateway's own settings), and compare entries
mixing an aggregated and a disaggregated fleet."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import commands
from bench.compare_presets import PresetParser
from bench.disagg import DisaggSpec, disaggregate, parse_disagg
from bench.fleet import Fleet
from bench.fleet_config import EngineOptions, GatewayOptions, gateway_config
from bench.report import row
from bench.summary import RunResult
from gateway.config.settings import parse_settings

URLS = [f"http://127.0.0.1:{9001 + i}" for i in range(4)]


def test_parse_disagg_counts_label_and_link() -> None:
    spec = parse_disagg("2:2")
    assert (spec.prefill, spec.decode, spec.replicas, spec.protocol, spec.kv_link) == (2, 2, 4, "vllm", None)
    assert spec.label == "disagg-2p2d"
    tcp = parse_disagg("1:3@tcp", protocol="sglang", kv_link="rdma")
    assert (tcp.prefill, tcp.decode, tcp.protocol) == (1, 3, "sglang")
    assert tcp.kv_link == "tcp", "the entry's link wins"
    assert tcp.label == "disagg-1p3d-tcp"
    assert parse_disagg("3:1", kv_link="rdma").kv_link == "rdma", "the default link when the entry names none"
    named = parse_disagg(" pd = 3:1@12.5 ")
    assert (named.label, named.kv_link) == ("pd", "12.5")


BAD_SPECS = ["2", "2:", ":2", "a:b", "2:2:2", "0:2", "2:0", "2:2@fast", "2:2@-5", "x=2:2@", "=2:2"]


@pytest.mark.parametrize("text", BAD_SPECS)
def test_parse_disagg_refuses_other_shapes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_disagg(text)


def test_spec_refuses_an_unknown_protocol() -> None:
    with pytest.raises(ValueError, match="protocol"):
        DisaggSpec(1, 1, protocol="mooncake")


def test_engine_roles_first_prefill_then_decode() -> None:
    spec = DisaggSpec(1, 3, protocol="sglang", kv_link="tcp")
    assert [spec.role(i) for i in range(4)] == ["prefill", "decode", "decode", "decode"]
    assert spec.engine_args(0) == ["--role", "prefill", "--disagg-protocol", "sglang", "--kv-link", "tcp"]
    assert DisaggSpec(1, 1).engine_args(1) == ["--role", "decode", "--disagg-protocol", "vllm"]
    with pytest.raises(ValueError):
        spec.role(4)


def test_fleet_starts_engines_with_their_roles_and_names_the_answering_ones() -> None:
    engine = EngineOptions(core="physics", profile="h100-13b-fp16", speed=0.5)
    fleet = Fleet(4, engine, GatewayOptions(disagg=DisaggSpec(2, 2, kv_link="rdma")), base_port=9000)
    argvs = [fleet._engine_argv(i) for i in range(4)]
    assert [a[a.index("--role") + 1] for a in argvs] == ["prefill", "prefill", "decode", "decode"]
    assert all(a[a.index("--kv-link") + 1] == "rdma" and "--profile" in a for a in argvs), "same engine flags"
    assert fleet.answering_engines == ["127.0.0.1:9003", "127.0.0.1:9004"], "the decode engines answer"
    plain = Fleet(2, engine, GatewayOptions(), base_port=9000)
    assert "--role" not in plain._engine_argv(0) and plain.answering_engines == list(plain.engines)
    with pytest.raises(ValueError, match="2:2 fleet has 4 engines, not 3"):
        Fleet(3, engine, GatewayOptions(disagg=DisaggSpec(2, 2)))


def test_gateway_config_of_a_disaggregated_fleet_is_accepted_by_the_gateway(tmp_path: Path) -> None:
    template = tmp_path / "gw.yaml"
    template.write_text(
        "pools:\n  - model: m\n    engine: vllm\n    policy: least-load\n"
        "    max_concurrency_per_replica: 16\n    replicas: {static: [http://old:1]}\n"
        "    timeouts: {ttft_s: 10}\n"
    )
    options = GatewayOptions(
        config_path=str(template),
        policy="prefix-index",
        pool_overrides={"disaggregation": {"prefill": {"policy": "round-robin"}}},
        disagg=DisaggSpec(1, 3, protocol="sglang"),
    )
    config = gateway_config(options, "m", URLS, 8000)
    pool = config["pools"][0]
    assert "replicas" not in pool and "policy" not in pool and "max_concurrency_per_replica" not in pool
    assert pool["timeouts"] == {"ttft_s": 10}, "other pool keys stay"
    assert pool["disaggregation"] == {
        "protocol": "sglang",
        "prefill": {
            "replicas": {"static": URLS[:1]},
            "max_concurrency_per_replica": 16,
            "policy": "round-robin",
        },
        "decode": {"replicas": {"static": URLS[1:]}, "max_concurrency_per_replica": 16},
    }
    settings = parse_settings(config)
    disagg = settings.pools[0].disaggregation
    assert disagg is not None and disagg.protocol == "sglang"
    assert (disagg.prefill_policy, disagg.decode_policy) == ("round-robin", "least-load")
    aggregated = gateway_config(GatewayOptions(policy="least-load"), "m", URLS, 8000)["pools"][0]
    assert aggregated["replicas"] == {"static": URLS} and "disaggregation" not in aggregated


def test_disaggregate_needs_one_url_per_engine() -> None:
    with pytest.raises(ValueError, match="needs 4 engines, got 3"):
        disaggregate({}, DisaggSpec(2, 2), URLS[:3])


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = PresetParser()
    commands.add_compare_arguments(parser)
    return parser.parse_args(argv)


def test_compare_mixes_an_aggregated_and_disaggregated_fleets() -> None:
    args = _parse(["--replicas", "4", "--variant", "agg:", "--disagg", "2:2", "--disagg", "1:3@tcp"])
    args.kv_link = "rdma"
    entries = commands._entries(args)
    assert [label for label, _, _ in entries] == ["agg", "disagg-2p2d", "disagg-1p3d-tcp"]
    gateways = [gateway for _, gateway, _ in entries]
    assert all(g is not None for g in gateways)
    assert [g.disagg for g in gateways if g is not None] == [
        None,
        DisaggSpec(2, 2, "vllm", "rdma", "disagg-2p2d"),
        DisaggSpec(1, 3, "vllm", "tcp", "disagg-1p3d-tcp"),
    ]
    with pytest.raises(ValueError, match="distinct labels"):
        commands._entries(_parse(["--disagg", "2:2", "--disagg", "2:2"]))
    with pytest.raises(ValueError, match="KV link"):
        commands._entries(_parse(["--disagg", "2:2", "--kv-link", "fast"]))


def test_run_takes_one_disaggregated_fleet_behind_the_gateway(tmp_path: Path) -> None:
    parser = PresetParser()
    commands.add_run_arguments(parser)
    base = ["--out", str(tmp_path), "--quiet"]
    with pytest.raises(ValueError, match="one --disagg"):
        commands.run_command(parser.parse_args([*base, "--disagg", "2:2", "--disagg", "1:3"]))
    with pytest.raises(ValueError, match="one --disagg"):
        commands.run_command(parser.parse_args([*base, "--disagg", "2:2", "--policy", "direct"]))
    with pytest.raises(ValueError, match="local disaggregated fleet"):
        commands.run_command(parser.parse_args([*base, "--disagg", "2:2", "--url", "http://x"]))


def test_report_shows_goodput_per_gpu() -> None:
    summary = {
        "requests": 10,
        "ok": 10,
        "rejected": 0,
        "errors": 0,
        "ttft_ms": None,
        "tpot_ms": None,
        "e2e_ms": None,
        "throughput": {"requests_per_s": 6.0, "output_tokens_per_s": 100.0},
        "goodput": {"requests_per_s": 5.0, "output_tokens_per_s": 90.0, "attainment_ratio": 0.9},
        "replicas": {"max_mean_ratio": 1.0},
    }
    result = RunResult("x", 1.0, "rate", [], {**summary, "gpus": 4}, {})
    assert row(result)["good_rps_gpu"] == "1.25"
    assert row(RunResult("x", 1.0, "rate", [], summary, {}))["good_rps_gpu"] == "–", "not a local fleet"
