"""gateway/fleet/alert_rules*.py without promtool (tests/deploy/test_alert_rules.py runs the rules): what the
generator derives from the settings — windows, selectors, excluded outcomes, bucket edges and their
warnings, cost figures — and the settings it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.base.errors import ErrorCode
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import ConfigError, Settings, parse_settings
from gateway.config.slo_settings import DEFAULT_AVAILABILITY_EXCLUDED_OUTCOMES, BurnRateAlert
from gateway.fleet.alert_rules import (
    RuleSet,
    alert_name,
    bucket_edge,
    bucket_edges,
    build_rules,
    prometheus_rule,
)
from gateway.fleet.alert_rules_promql import duration, number, selector

MODEL = "m"


def _settings(**pool: Any) -> Settings:
    return parse_settings(
        {"pools": [{"model": MODEL, "replicas": {"static": ["http://127.0.0.1:1"]}, **pool}]}
    )


def _records(rules: RuleSet, name: str) -> list[dict[str, Any]]:
    return [r for g in rules.groups for r in g["rules"] if r.get("record") == name]


def test_promql_pieces() -> None:
    assert [duration(s) for s in (300, 1800, 3600, 21600, 90, 86400)] == [
        "5m",
        "30m",
        "1h",
        "6h",
        "90s",
        "1d",
    ]
    assert number(1 - 0.99) == "0.01" and number(6.0) == "6" and number(14.4) == "14.4"
    assert selector(model="a") == '{model="a"}'
    assert (
        selector('namespace="ml",', model="a", outcome_not="x|y")
        == '{model="a",outcome!~"x|y",namespace="ml"}'
    )
    assert selector() == ""
    assert selector(model='we"ird') == '{model="we\\"ird"}'


def test_default_rules_record_every_window_of_both_slos_and_four_alerts() -> None:
    rules = build_rules(_settings())
    assert {f"llm_gateway:slo_burn_rate:rate{w}" for w in ("5m", "30m", "1h", "6h")} <= rules.recorded_names()
    burn_5m = _records(rules, "llm_gateway:slo_burn_rate:rate5m")
    assert sorted(r["labels"]["slo"] for r in burn_5m) == ["availability", "latency"]
    assert {r["expr"].rsplit("/ ", 1)[1] for r in burn_5m} == {"0.01", "0.001"}  # 1 − objective
    alerts = {a["alert"]: a for a in rules.alert_rules()}
    assert sorted(alerts) == [
        "LLMGatewayAvailabilityBudgetBurnFast",
        "LLMGatewayAvailabilityBudgetBurnSlow",
        "LLMGatewayLatencyBudgetBurnFast",
        "LLMGatewayLatencyBudgetBurnSlow",
        "LLMGatewayLearnedCapHeldAtFloor",  # the fleet's, below
    ]
    fast = alerts["LLMGatewayLatencyBudgetBurnFast"]
    assert fast["expr"] == (
        'llm_gateway:slo_burn_rate:rate1h{model="m",slo="latency"} > 14.4'
        ' and llm_gateway:slo_burn_rate:rate5m{model="m",slo="latency"} > 14.4'
    )
    assert fast["labels"] == {"severity": "page", "slo": "latency", "burn": "fast", "model": MODEL}
    assert alerts["LLMGatewayAvailabilityBudgetBurnSlow"]["labels"]["severity"] == "ticket"
    assert rules.warnings == []  # 2 s and 50 ms are bucket edges


def test_windows_and_alerts_follow_the_settings() -> None:
    alerts = [
        {
            "name": "very_slow",
            "burn_rate": 1,
            "long_window_s": 259200,
            "short_window_s": 21600,
            "severity": "info",
        }
    ]
    rules = build_rules(_settings(slo={"burn_rate_alerts": alerts}))
    names = rules.recorded_names()
    assert "llm_gateway:slo_error_ratio:rate3d" in names and "llm_gateway:slo_error_ratio:rate6h" in names
    assert "llm_gateway:slo_error_ratio:rate1h" not in names
    assert [a["alert"] for a in rules.alert_rules() if "BudgetBurn" in a["alert"]] == [
        "LLMGatewayLatencyBudgetBurnVerySlow",
        "LLMGatewayAvailabilityBudgetBurnVerySlow",
    ]
    assert alert_name("latency", BurnRateAlert(name="x", burn_rate=2, long_window_s=2, short_window_s=1)) == (
        "LLMGatewayLatencyBudgetBurnX"
    )


def test_availability_counts_everything_but_success_and_the_excluded_outcomes_as_failed() -> None:
    ratio = _records(build_rules(_settings()), "llm_gateway:slo_error_ratio:rate5m")
    availability = next(r for r in ratio if r["labels"]["slo"] == "availability")["expr"]
    excluded = "|".join(sorted(DEFAULT_AVAILABILITY_EXCLUDED_OUTCOMES))
    failed, valid = availability.split(" / ")
    assert f'outcome!~"success|{excluded}"' in failed and f'outcome!~"{excluded}"' in valid
    # load shedding, engine and gateway failures are failures
    for outcome in ("queue_full", "queue_timeout", "no_replica", "upstream_status", "internal_error"):
        assert outcome not in availability
    none = _records(
        build_rules(_settings(slo={"availability_excluded_outcomes": []})),
        "llm_gateway:slo_error_ratio:rate5m",
    )
    failed, valid = next(r for r in none if r["labels"]["slo"] == "availability")["expr"].split(" / ")
    assert 'outcome!~"success"' in failed and "outcome" not in valid


def test_every_error_code_is_classified_deliberately() -> None:
    """A new error code counts as an availability failure unless it is added to the excluded defaults."""
    failures = {str(code) for code in ErrorCode} - set(DEFAULT_AVAILABILITY_EXCLUDED_OUTCOMES)
    assert failures == {
        "queue_full", "queue_timeout", "no_replica", "draining", "state_unavailable", "connection_limit",
        "upstream_connect", "upstream_ttft_timeout", "upstream_idle_timeout", "upstream_total_timeout",
        "upstream_status", "upstream_protocol", "internal_error",
        "response_state_lost",  # a replica holding stored responses left: the fleet lost them
    }  # fmt: skip


def test_a_pool_without_latency_bounds_gets_only_availability_rules() -> None:
    rules = build_rules(_settings(slo={"ttft_s": None, "tpot_s": None}))
    assert {a["labels"]["slo"] for a in rules.alert_rules()} == {"availability"}
    assert not any("within_bound" in name for name in rules.recorded_names())


def test_extra_matchers_narrow_every_raw_selector() -> None:
    rules = build_rules(_settings(cost={"gpu_usd_per_hour": 1}), 'namespace="ml"')
    raw = [r["expr"] for g in rules.groups for r in g["rules"] if "llm_gateway_" in r["expr"]]
    assert raw
    for expr in raw:
        for selected in expr.split("llm_gateway_")[1:]:
            assert selected.split("[")[0].split(")")[0].endswith('namespace="ml"}'), expr


def test_bucket_edges_are_the_exported_ones() -> None:
    edges = bucket_edges(GatewayMetrics().ttft_seconds)
    assert (2.0, "2.0") in edges and (1.0, "1.0") in edges and all(le != "+Inf" for _, le in edges)
    assert bucket_edge(2.0, edges) == (2.0, "2.0")
    assert bucket_edge(1.7, edges) == (1.0, "1.0")
    assert bucket_edge(0.001, edges) is None


def test_a_bound_off_a_bucket_edge_rounds_down_with_a_warning() -> None:
    rules = build_rules(_settings(slo={"ttft_s": 1.7, "tpot_s": 0.001}))
    ttft = _records(rules, "llm_gateway:slo_ttft_within_bound:ratio_rate5m")
    assert [r["labels"]["le"] for r in ttft] == ["1.0"] and 'le="1.0"' in ttft[0]["expr"]
    assert not _records(rules, "llm_gateway:slo_tpot_within_bound:ratio_rate5m")
    assert len(rules.warnings) == 2
    assert "slo.ttft_s 1.7 is not a bucket edge" in rules.warnings[0] and 'le="1.0"' in rules.warnings[0]
    assert "slo.tpot_s 0.001 is below every bucket" in rules.warnings[1]


def test_cost_rules_and_the_planners_figure() -> None:
    assert not any("cost" in name for name in build_rules(_settings()).recorded_names())
    rules = build_rules(
        _settings(
            cost={"gpu_usd_per_hour": 2.5, "gpus_per_replica": 2},
            autoscale={"decode_tokens_per_s": 4352, "b_max": 64},
        )
    )
    at_b_max = _records(rules, "llm_gateway:cost_usd_per_million_tokens_at_b_max")[0]
    # DESIGN §7: $2.5/h at 4,352 tok/s ≈ $0.16 per million tokens; two GPUs per replica double it
    assert (
        float(at_b_max["expr"])
        == pytest.approx(2 * 2.5 / (4352 * 3600) * 1e6)
        == pytest.approx(0.319, abs=1e-3)
    )
    gpu_cost = _records(rules, "llm_gateway:gpu_cost_usd_per_second")[0]["expr"]
    assert gpu_cost == 'llm_gateway:pool_replicas:max{model="m"} * 2 * 2.5 / 3600'
    assert "llm-gateway-cost:tenants" in [group["name"] for group in rules.groups]
    no_planner = build_rules(_settings(cost={"gpu_usd_per_hour": 2.5}))
    assert not _records(no_planner, "llm_gateway:cost_usd_per_million_tokens_at_b_max")


def test_one_learned_cap_alert_for_the_fleet_when_any_pool_learns_a_cap() -> None:
    rules = build_rules(_settings(), 'namespace="prod"')
    (group,) = [g for g in rules.groups if g["name"] == "llm-gateway-learned-cap"]
    (alert,) = group["rules"]
    assert alert["alert"] == "LLMGatewayLearnedCapHeldAtFloor" and alert["labels"] == {"severity": "ticket"}
    assert alert["expr"] == (
        'max by (replica) (min_over_time(llm_gateway_learned_cap_held_at_floor{namespace="prod"}[2m])) == 1'
    )
    assert alert["for"] == "15m"
    assert "slo.tpot_s" in alert["annotations"]["description"]
    for pool in (
        {"latency_model": {"adaptive_cap": False}},
        {"latency_model": {"enabled": False}},
        {"slo": {"tpot_s": None}},
    ):
        names = [g["name"] for g in build_rules(_settings(**pool)).groups]
        assert "llm-gateway-learned-cap" not in names, pool


def test_prometheus_rule_wraps_the_same_groups() -> None:
    rules = build_rules(_settings())
    document = prometheus_rule(rules, "custom")
    assert document["kind"] == "PrometheusRule" and document["metadata"]["name"] == "custom"
    assert document["spec"]["groups"] is rules.groups


@pytest.mark.parametrize(
    ("slo", "message"),
    [
        ({"objective_ratio": 0.9}, "could never fire"),  # 14.4 × 0.1 ≥ 1
        ({"availability_excluded_outcomes": ["bogus"]}, "unknown outcome"),
        ({"availability_excluded_outcomes": ["success"]}, "unknown outcome"),
        (
            {
                "burn_rate_alerts": [
                    {"name": "a", "burn_rate": 2, "long_window_s": 300, "short_window_s": 300}
                ]
            },
            "shorter than long_window_s",
        ),
        (
            {
                "burn_rate_alerts": [
                    {"name": "a", "burn_rate": 2, "long_window_s": 600, "short_window_s": 60}
                ]
                * 2
            },
            "names must be unique",
        ),
        ({"objective_ratio": 1}, "objective_ratio"),
    ],
)
def test_settings_refuse_alerts_that_cannot_work(slo: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        _settings(slo=slo)
    assert "pools.0.slo" in str(info.value)
