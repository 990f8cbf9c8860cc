"""Fleet launcher configuration, engine /metrics parsing, the prefix oracle, CPU readings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.engine_metrics import EngineSnapshot, LoadSeries, parse_metrics, prefix_hit_ratio
from bench.fleet_config import EngineOptions, GatewayOptions, gateway_config
from bench.oracle import PrefixOracle, block_hashes
from bench.proc import CpuReading, cpu_ns, cpu_seconds
from bench.workload import RequestSpec

METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
vllm:num_requests_running{model_name="b"} 1.0
vllm:num_requests_waiting{model_name="a"} 2.0
vllm:kv_cache_usage_perc{model_name="a"} 0.25
vllm:prefix_cache_queries_total{model_name="a"} 1000.0
vllm:prefix_cache_hits_total{model_name="a"} 750.0
vllm:generation_tokens_total{model_name="a"} 99.0
"""


def test_parse_metrics_sums_label_sets() -> None:
    snap = parse_metrics(METRICS)
    assert snap == EngineSnapshot(4.0, 2.0, 0.25, 1000.0, 750.0)
    assert snap.load == 6.0
    assert parse_metrics("garbage line\n") == EngineSnapshot()


def test_prefix_hit_ratio_is_the_delta_over_engines() -> None:
    start = {"a": EngineSnapshot(prefix_queries_tokens=100, prefix_hits_tokens=50)}
    end = {
        "a": EngineSnapshot(prefix_queries_tokens=300, prefix_hits_tokens=200),
        "b": EngineSnapshot(prefix_queries_tokens=999, prefix_hits_tokens=999),  # no baseline: skipped
    }
    assert prefix_hit_ratio(start, end) == (0.75, 150.0, 200.0)
    assert prefix_hit_ratio({}, {}) == (None, 0.0, 0.0)


def test_load_series_means_within_a_window() -> None:
    series = LoadSeries(
        [
            (0.0, "a", EngineSnapshot(running=2)),
            (1.0, "a", EngineSnapshot(running=4)),
            (1.0, "b", EngineSnapshot(waiting=1)),
            (9.0, "a", EngineSnapshot(running=100)),
        ]
    )
    assert series.mean_load(0.0, 5.0) == {"a": 3.0, "b": 1.0}
    assert series.peak_load() == {"a": 100.0, "b": 1.0}
    assert series.replicas() == ["a", "b"]


def test_engine_argv_passes_only_the_flags_set() -> None:
    fixed = EngineOptions(model="m", first_token_delay_ms=5, token_delay_ms=1, seed=3).argv(9000, 2)
    assert fixed[:2] == ["-m", "mock_engine"]
    assert "--core" not in fixed and "--profile" not in fixed
    assert fixed[fixed.index("--seed") + 1] == "5"  # seed + replica index
    physics = EngineOptions(core="physics", profile="tiny", speed=20.0).argv(9001, 0)
    assert physics[physics.index("--core") + 1] == "physics"
    assert physics[physics.index("--speed") + 1] == "20.0"
    assert "--first-token-delay-ms" not in physics


def test_gateway_config_generated_and_from_a_template(tmp_path: Path) -> None:
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    raw = gateway_config(GatewayOptions(policy="round-robin"), "m", urls, 8080)
    assert raw["server"] == {"host": "127.0.0.1", "port": 8080, "drain_timeout_s": 1}
    assert raw["pools"] == [
        {"engine": "vllm", "model": "m", "replicas": {"static": urls}, "policy": "round-robin"}
    ]
    template = tmp_path / "g.yaml"
    template.write_text(
        "server: {port: 1, drain_timeout_s: 5}\n"
        "pools:\n  - {model: other, replicas: {static: []}, policy: least-load}\n"
        "admission: {max_queue_depth: 10}\n"
    )
    options = GatewayOptions(
        config_path=str(template),
        pool_overrides={"max_concurrency_per_replica": 4},
        extra_pools=({"model": "x", "replicas": {"static": ["http://h:1"]}},),
    )
    raw = gateway_config(options, "m", urls, 9000)
    assert raw["server"] == {"port": 9000, "drain_timeout_s": 5, "host": "127.0.0.1"}
    assert raw["admission"] == {"max_queue_depth": 10}
    first = raw["pools"][0]
    assert (first["model"], first["policy"], first["max_concurrency_per_replica"]) == ("m", "least-load", 4)
    assert first["replicas"] == {"static": urls}
    assert raw["pools"][1]["model"] == "x"


def test_oracle_follows_the_longest_prefix_and_spreads_new_ones() -> None:
    oracle = PrefixOracle(["http://a", "http://b"], block_chars=4)

    def spec(text: str) -> RequestSpec:
        return RequestSpec(messages=(("user", text),))

    assert oracle.pick(spec("aaaabbbbcccc")) == "http://a"  # nothing held: fewest sent
    assert oracle.pick(spec("xxxxyyyy")) == "http://b"
    assert oracle.pick(spec("aaaabbbbzzzz")) == "http://a"  # shares two blocks with a
    assert oracle.pick(spec("xxxxqqqq")) == "http://b"
    assert oracle.matched_blocks(0, block_hashes("aaaabbbbcccc", 4)) == 3
    assert block_hashes("aaaab", 4) == block_hashes("aaaa", 4), "a partial block is not hashed"


def test_cpu_readings_of_this_process() -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc")
    before = CpuReading.of(os.getpid())
    sum(i * i for i in range(300_000))
    after = CpuReading.of(os.getpid())
    assert cpu_seconds(os.getpid()) >= before.ticks_s
    assert cpu_ns(os.getpid()) > 0
    per = before.per_request_us(after, 10)
    assert per["schedstat_us"] is not None and per["schedstat_us"] > 0
    assert before.per_request_us(after, 0) == {"stat_us": None, "schedstat_us": None}
