"""The mock engine's /metrics in each flavour, read back by the gateway's adapter for that flavour."""

from __future__ import annotations

import pytest

from gateway.upstream.engine_metrics import ADAPTERS
from mock_engine.core import EngineStats
from mock_engine.metrics_text import FLAVOURS, render_metrics

STATS = EngineStats(
    running=13,
    waiting=4,
    kv_usage_ratio=0.6875,
    prefix_cache_queries_tokens=12_000,
    prefix_cache_hits_tokens=4_500,
    prompt_tokens_total=11_200,
    generation_tokens_total=98_765,
    preemptions_total=2,
)
IDLE = EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0)
MODEL = 'org/model "v2"'  # a served name that needs label escaping

# Which EngineSample fields each flavour carries (TGI exports neither KV usage nor prefix-cache data).
CARRIES_KV = {"vllm": True, "sglang": True, "tgi": False, "llamacpp": True}
CARRIES_HITS = {"vllm": True, "sglang": True, "tgi": False, "llamacpp": True}


def test_the_mock_imitates_every_scraped_flavour() -> None:
    assert set(FLAVOURS) == set(ADAPTERS)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_round_trip_gives_back_the_engine_numbers(flavour: str) -> None:
    text = render_metrics(MODEL, STATS, flavour=flavour).decode()
    got = ADAPTERS[flavour].sample(text, taken_at_s=1.0, model=MODEL)
    assert (got.running, got.waiting) == (13.0, 4.0)
    assert got.kv_usage_ratio == (0.6875 if CARRIES_KV[flavour] else None)
    expected_hits = pytest.approx(4_500 / 12_000) if CARRIES_HITS[flavour] else None
    assert got.prefix_cache_hit_ratio == expected_hits


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_round_trip_of_an_idle_engine(flavour: str) -> None:
    text = render_metrics(MODEL, IDLE, flavour=flavour).decode()
    got = ADAPTERS[flavour].sample(text, taken_at_s=1.0, model=MODEL)
    assert (got.running, got.waiting) == (0.0, 0.0)
    assert got.kv_usage_ratio in (0.0, None)
    # counters with no query yet: unknown; SGLang's own gauge reports 0.0 before any query
    assert got.prefix_cache_hit_ratio == (0.0 if flavour == "sglang" else None)


@pytest.mark.parametrize("flavour", ["vllm", "llamacpp"])
def test_counter_flavours_round_trip_the_interval_hit_ratio(flavour: str) -> None:
    adapter = ADAPTERS[flavour]
    first = adapter.sample(render_metrics(MODEL, STATS, flavour=flavour).decode(), taken_at_s=1.0)
    later_stats = EngineStats(13, 4, 0.6875, 14_000, 6_000, 11_200, 98_765, 2)
    later = adapter.sample(
        render_metrics(MODEL, later_stats, flavour=flavour).decode(), taken_at_s=1.5, previous=first
    )
    assert later.prefix_cache_hit_ratio == pytest.approx(1_500 / 2_000)


def test_default_flavour_is_vllm_and_keeps_the_original_call_shape() -> None:
    assert render_metrics("m", STATS) == render_metrics("m", STATS, flavour="vllm")
    text = render_metrics("m", STATS).decode()
    assert (
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 13.0'
        in text
    )
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 4500.0' in text


def test_each_flavour_uses_its_engine_names() -> None:
    bodies = {f: render_metrics("m", STATS, flavour=f).decode() for f in FLAVOURS}
    assert 'sglang:num_queue_reqs{model_name="m"} 4.0' in bodies["sglang"]
    assert "\ntgi_queue_size 4\n" in bodies["tgi"]
    assert "\nllamacpp:requests_deferred 4\n" in bodies["llamacpp"]
    assert "llamacpp:prompt_tokens_total 7500\n" in bodies["llamacpp"]  # excludes the 4,500 cached


def test_unknown_flavour_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown metrics flavour"):
        render_metrics("m", STATS, flavour="triton")


CARRIES_TOKEN_LATENCY = {"vllm": True, "sglang": True, "tgi": False, "llamacpp": False}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_round_trip_of_the_inter_token_latency_histogram(flavour: str) -> None:
    from dataclasses import replace

    adapter = ADAPTERS[flavour]
    first = adapter.sample(
        render_metrics(MODEL, STATS, flavour=flavour).decode(), taken_at_s=1.0, model=MODEL
    )
    later = replace(STATS, inter_token_latency_sum_s=80 * 0.025, inter_token_latency_count=80)
    got = adapter.sample(
        render_metrics(MODEL, later, flavour=flavour).decode(), taken_at_s=2.0, previous=first, model=MODEL
    )
    assert got.token_latency_s == (pytest.approx(0.025) if CARRIES_TOKEN_LATENCY[flavour] else None)
