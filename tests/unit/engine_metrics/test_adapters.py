from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gateway.upstream.engine_metrics import (
    ADAPTERS,
    EngineMetricsError,
    EngineSample,
    ScrapeErrorReason,
    adapter_for,
    known_flavours,
)
from gateway.upstream.engine_metrics.counter_windows import MIN_WINDOW_QUERY_TOKENS, MIN_WINDOW_TOKEN_GAPS
from tests.unit.engine_metrics import fixtures


def sample(flavour: str, text: str, **kwargs: Any) -> EngineSample:
    return ADAPTERS[flavour].sample(text, taken_at_s=kwargs.pop("taken_at_s", 10.0), **kwargs)


def test_vllm_v1_reads_the_current_names_and_counters() -> None:
    got = sample("vllm", fixtures.VLLM_V1, model=fixtures.VLLM_MODEL)
    assert (got.running, got.waiting, got.kv_usage_ratio) == (7.0, 2.0, 0.4375)
    assert got.prefix_cache_hit_ratio == pytest.approx(30720 / 48213)  # first sample: cumulative
    assert (got.prefix_cache_window_hits_tokens, got.prefix_cache_window_queries_tokens) == (30720.0, 48213.0)
    assert got.taken_at_s == 10.0


def test_vllm_data_parallel_ranks_sum_counts_and_average_ratios() -> None:
    got = sample("vllm", fixtures.VLLM_DP2, model=fixtures.VLLM_MODEL)
    assert (got.running, got.waiting) == (8.0, 1.0)
    assert got.kv_usage_ratio == pytest.approx(0.375)
    assert got.prefix_cache_hit_ratio == pytest.approx(400 / 1000)


def test_vllm_v0_falls_back_to_the_old_kv_name_and_hit_rate_gauge() -> None:
    got = sample("vllm", fixtures.VLLM_V0)
    assert (got.running, got.waiting) == (4.0, 11.0)
    assert got.kv_usage_ratio == pytest.approx(0.9823)
    assert got.prefix_cache_hit_ratio == 0.125
    assert got.prefix_cache_window_hits_tokens is None


def test_sglang_reads_its_gauges_and_prefers_the_hit_rate_gauge() -> None:
    got = sample("sglang", fixtures.SGLANG, model=fixtures.SGLANG_MODEL)
    assert (got.running, got.waiting, got.kv_usage_ratio) == (23.0, 5.0, 0.28)
    assert got.prefix_cache_hit_ratio == pytest.approx(0.007507552643049313)


def test_sglang_without_the_gauge_uses_cached_over_prompt_tokens() -> None:
    text = fixtures.SGLANG.replace("sglang:cache_hit_rate{", "sglang:other{")
    got = sample("sglang", text)
    assert got.prefix_cache_hit_ratio == pytest.approx(61026 / 8.128902e6)


def test_tgi_has_no_kv_or_prefix_signal() -> None:
    got = sample("tgi", fixtures.TGI, model="anything")
    assert (got.running, got.waiting) == (12.0, 3.0)
    assert got.kv_usage_ratio is None
    assert got.prefix_cache_hit_ratio is None


def test_llamacpp_current_build_counts_cached_tokens_as_hits() -> None:
    got = sample("llamacpp", fixtures.LLAMACPP)
    assert (got.running, got.waiting) == (4.0, 39.0)
    assert got.kv_usage_ratio is None
    assert got.prefix_cache_hit_ratio == pytest.approx(2000 / (6000 + 2000))


def test_llamacpp_old_build_reads_the_kv_ratio() -> None:
    got = sample("llamacpp", fixtures.LLAMACPP_OLD)
    assert (got.running, got.waiting) == (2.0, 0.0)
    assert got.kv_usage_ratio == pytest.approx(0.849609)
    assert got.prefix_cache_hit_ratio is None


TWO_MODELS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 1.0
vllm:num_requests_running{engine="0",model_name="b"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 2.0
vllm:num_requests_waiting{engine="0",model_name="b"} 7.0
"""


def test_the_served_model_label_selects_its_label_sets() -> None:
    assert sample("vllm", TWO_MODELS, model="b").running == 5.0
    assert sample("vllm", TWO_MODELS, model="a").waiting == 2.0


def test_an_unmatched_or_absent_model_uses_every_label_set() -> None:
    assert sample("vllm", TWO_MODELS, model="served-under-another-name").running == 6.0
    assert sample("vllm", TWO_MODELS).waiting == 9.0


def test_nan_samples_are_no_value() -> None:
    text = fixtures.VLLM_DP2.replace(
        'vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25',
        'vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} NaN',
    )
    assert sample("vllm", text).kv_usage_ratio == 0.5  # the NaN rank is dropped, not averaged in
    all_nan = fixtures.LLAMACPP_OLD.replace(
        "llamacpp:kv_cache_usage_ratio 0.849609", "llamacpp:kv_cache_usage_ratio NaN"
    )
    assert sample("llamacpp", all_nan).kv_usage_ratio is None


def test_a_nan_required_metric_counts_as_missing() -> None:
    text = fixtures.TGI.replace("tgi_queue_size 3", "tgi_queue_size NaN")
    with pytest.raises(EngineMetricsError) as excinfo:
        sample("tgi", text)
    assert excinfo.value.reason is ScrapeErrorReason.MISSING_METRICS
    assert "tgi_queue_size" in excinfo.value.detail


@pytest.mark.parametrize("flavour", ["vllm", "sglang", "tgi", "llamacpp"])
def test_missing_required_metrics_are_an_error_not_zeros(flavour: str) -> None:
    other = fixtures.TGI if flavour != "tgi" else fixtures.VLLM_V1  # a flavour mismatch
    with pytest.raises(EngineMetricsError) as excinfo:
        sample(flavour, other)
    assert excinfo.value.reason is ScrapeErrorReason.MISSING_METRICS


@pytest.mark.parametrize("text", ["", "<html><body>404 Not Found</body></html>", "# only comments\n"])
def test_bodies_without_samples_are_missing_metrics(text: str) -> None:
    with pytest.raises(EngineMetricsError) as excinfo:
        sample("vllm", text)
    assert excinfo.value.reason is ScrapeErrorReason.MISSING_METRICS


def test_malformed_wanted_lines_are_a_parse_error() -> None:
    text = fixtures.VLLM_V1.replace(
        "vllm:num_requests_waiting{engine", "vllm:num_requests_waiting{engine=0,x"
    )
    with pytest.raises(EngineMetricsError) as excinfo:
        sample("vllm", text)
    assert excinfo.value.reason is ScrapeErrorReason.PARSE


def test_out_of_range_values_are_clamped() -> None:
    text = (
        "llamacpp:requests_processing -1\n"
        "llamacpp:requests_deferred 2\n"
        "llamacpp:kv_cache_usage_ratio 1.0000001\n"
    )
    got = sample("llamacpp", text)
    assert (got.running, got.waiting, got.kv_usage_ratio) == (0.0, 2.0, 1.0)


def counters(hits: float, queries: float) -> str:
    return f"""vllm:num_requests_running 0
vllm:num_requests_waiting 0
vllm:prefix_cache_hits_total {hits}
vllm:prefix_cache_queries_total {queries}
"""


def test_counter_hit_ratio_uses_deltas_since_the_previous_sample() -> None:
    first = sample("vllm", counters(100, 1000))
    assert first.prefix_cache_hit_ratio == pytest.approx(0.1)
    second = sample("vllm", counters(400, 1400), previous=first)
    assert second.prefix_cache_hit_ratio == pytest.approx(300 / 400)


def test_counter_hit_ratio_carries_over_an_idle_interval() -> None:
    first = sample("vllm", counters(100, 1000))
    idle = sample("vllm", counters(100, 1000), previous=first)
    assert idle.prefix_cache_hit_ratio == pytest.approx(0.1)


def test_a_late_bump_of_one_counter_does_not_read_as_a_miss() -> None:
    # llama.cpp: a full hit adds its 1,759 cached tokens (hits and queries) when the request starts and
    # its 8 processed tokens (queries only) when its prefill ends, often in the next scrape interval.
    cold = sample("vllm", counters(0, 1767))
    started = sample("vllm", counters(1759, 1767 + 1759), previous=cold)
    assert started.prefix_cache_hit_ratio == pytest.approx(1.0)
    tail = sample("vllm", counters(1759, 1767 + 1759 + 8), previous=started)
    assert tail.prefix_cache_hit_ratio == pytest.approx(1.0)  # 8 tokens: the window stays open
    idle = sample("vllm", counters(1759, 1767 + 1759 + 8), previous=tail)
    assert idle.prefix_cache_hit_ratio == pytest.approx(1.0)
    again = sample("vllm", counters(2 * 1759, 1767 + 2 * 1759 + 8), previous=idle)
    assert again.prefix_cache_hit_ratio == pytest.approx(1759 / (1759 + 8))  # the tail joins this window


def test_small_windows_add_up_until_they_hold_enough_tokens() -> None:
    first = sample("vllm", counters(0, 1000))
    assert MIN_WINDOW_QUERY_TOKENS == 256
    partial = sample("vllm", counters(100, 1100), previous=first)
    assert partial.prefix_cache_hit_ratio == pytest.approx(0.0)  # 100 tokens: the last closed ratio
    closed = sample("vllm", counters(100, 1300), previous=partial)
    assert closed.prefix_cache_hit_ratio == pytest.approx(100 / 300)


def test_before_any_window_closes_the_open_one_is_better_than_nothing() -> None:
    never = sample("vllm", counters(0, 0))
    assert never.prefix_cache_hit_ratio is None
    assert sample("vllm", counters(10, 20), previous=never).prefix_cache_hit_ratio == pytest.approx(0.5)


def test_counter_reset_after_an_engine_restart_falls_back_to_cumulative() -> None:
    before = sample("vllm", counters(5000, 10000))
    after = sample("vllm", counters(30, 40), previous=before)
    assert after.prefix_cache_hit_ratio == pytest.approx(0.75)


def test_never_queried_engine_has_no_hit_ratio() -> None:
    got = sample("vllm", counters(0, 0))
    assert got.prefix_cache_hit_ratio is None
    assert sample("vllm", counters(0, 0), previous=got).prefix_cache_hit_ratio is None


def test_previous_sample_without_counters_is_like_no_previous() -> None:
    previous = replace(sample("vllm", counters(1, 2)), prefix_cache_window_hits_tokens=None)
    assert sample("vllm", counters(3, 4), previous=previous).prefix_cache_hit_ratio == pytest.approx(0.75)


def test_to_load_reports_age_and_reads_a_missing_kv_ratio_as_zero() -> None:
    got = sample("tgi", fixtures.TGI, taken_at_s=100.0)
    load = got.to_load(100.25)
    assert (load.running, load.waiting, load.kv_usage_ratio) == (12.0, 3.0, 0.0)
    assert load.age_s == pytest.approx(0.25)
    assert load.stale is False


def test_registry_is_keyed_by_flavour_and_openai_is_not_scraped() -> None:
    assert known_flavours() == ("vllm", "sglang", "tgi", "llamacpp", "openai")
    for flavour in ("vllm", "sglang", "tgi", "llamacpp"):
        adapter = adapter_for(flavour)
        assert adapter is not None and adapter.flavour == flavour
    assert adapter_for("openai") is None
    with pytest.raises(ValueError, match="unknown engine flavour"):
        adapter_for("triton")


def test_every_configurable_engine_flavour_is_known() -> None:
    from typing import get_args

    from gateway.config.settings import EngineFlavour

    assert set(get_args(EngineFlavour)) == set(known_flavours())


LORA_INFO = """\
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",waiting_lora_adapters="x"} 1.7000005e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""} 1.7000001e+09
"""


def test_vllm_lora_info_reads_the_newest_label_set_of_running_and_waiting_adapters() -> None:
    got = sample("vllm", fixtures.VLLM_V1 + LORA_INFO, model=fixtures.VLLM_MODEL)
    assert got.running_adapters == {"sql", "chat"}
    assert got.waiting_adapters == {"x"}
    assert got.max_loras == 2 and got.to_load(10.0).max_loras == 2
    assert got.to_load(10.0).running_adapters == {"sql", "chat"}
    assert ADAPTERS["vllm"].exports_lora and not ADAPTERS["sglang"].exports_lora


def test_without_the_lora_gauge_no_adapter_is_reported() -> None:
    got = sample("vllm", fixtures.VLLM_V1, model=fixtures.VLLM_MODEL)
    assert got.running_adapters == frozenset() and got.waiting_adapters == frozenset()


def token_latency(
    flavour: str, total_s: float, count: float, name: str = "inter_token_latency_seconds"
) -> str:
    running, waiting = {
        "vllm": ("num_requests_running", "num_requests_waiting"),
        "sglang": (
            "num_running_reqs",
            "num_queue_reqs",
        ),
    }[flavour]
    return f"""{flavour}:{running} 3
{flavour}:{waiting} 0
{flavour}:{name}_sum {total_s}
{flavour}:{name}_count {count}
"""


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_token_latency_is_the_mean_gap_of_a_closed_window_reported_once(flavour: str) -> None:
    assert MIN_WINDOW_TOKEN_GAPS == 32
    first = sample(flavour, token_latency(flavour, 10.0, 1000))
    assert first.token_latency_s is None, "the first sample only opens the window"
    closed = sample(flavour, token_latency(flavour, 10.0 + 64 * 0.04, 1064), previous=first)
    assert closed.token_latency_s == pytest.approx(0.04)
    idle = sample(flavour, token_latency(flavour, 10.0 + 64 * 0.04, 1064), previous=closed)
    assert idle.token_latency_s is None, "a window reaches the budget once; an idle interval says nothing"


def test_a_token_window_stays_open_until_it_holds_enough_gaps() -> None:
    first = sample("vllm", token_latency("vllm", 0.0, 0))
    partial = sample("vllm", token_latency("vllm", 20 * 0.05, 20), previous=first)
    assert partial.token_latency_s is None
    closed = sample("vllm", token_latency("vllm", 20 * 0.05 + 20 * 0.03, 40), previous=partial)
    assert closed.token_latency_s == pytest.approx((20 * 0.05 + 20 * 0.03) / 40)


def test_token_latency_reopens_after_an_engine_restart_and_reads_the_older_name() -> None:
    before = sample("vllm", token_latency("vllm", 100.0, 5000, "time_per_output_token_seconds"))
    restarted = sample(
        "vllm", token_latency("vllm", 1.0, 50, "time_per_output_token_seconds"), previous=before
    )
    assert restarted.token_latency_s is None, "a counter went down: the window reopens, nothing reported"
    after = sample(
        "vllm",
        token_latency("vllm", 1.0 + 40 * 0.02, 90, "time_per_output_token_seconds"),
        previous=restarted,
    )
    assert after.token_latency_s == pytest.approx(0.02)


def test_flavours_without_the_histogram_report_no_token_latency() -> None:
    assert sample("vllm", counters(1, 2)).token_latency_s is None
