"""The generated Prometheus rules, checked by the real rule checker: deploy/kubernetes/prometheusrule.yaml is
exactly what `llm-gateway alerts` makes of deploy/kubernetes/gateway-config.yaml; `promtool check rules`
accepts the rules; `promtool test rules` on synthetic series shows each burn-rate alert (latency and
availability, fast and slow) firing during its burn and resolving after it, excluded outcomes burning
nothing, and the cost rules computing the documented figures.

promtool comes from Debian's `prometheus` package (`make install-deploy-tools`, which .ci/run calls):
without it these tests skip, or fail under LLM_GATEWAY_REQUIRE_DEPLOY_TOOLS=1.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.settings import Settings, load_settings, parse_settings
from gateway.fleet.alert_rules import RuleSet, build_rules, prometheus_rule, render, rules_file
from tests.deploy.manifests import EXAMPLE_CONFIG, KUBE_DIR, example_rules, find, rendered
from tests.deploy.tools import REPO, require_executable

CONFIG = EXAMPLE_CONFIG
SHIPPED = KUBE_DIR / "prometheusrule.yaml"
MODEL = "m"
PER_MIN = 600  # requests per minute in the synthetic series


def _settings(**pool: Any) -> Settings:
    return parse_settings(
        {"pools": [{"model": MODEL, "replicas": {"static": ["http://127.0.0.1:1"]}, **pool}]}
    )


def _promtool() -> str:
    return require_executable(
        "promtool", "prometheus", how="apt-get install prometheus; make install-deploy-tools"
    )


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _promtool_test(tmp_path: Path, series: list[dict[str, str]], **tests: list[dict[str, Any]]) -> None:
    """`promtool test rules` on `series` (one sample a minute) with the given `alert_rule_test` or
    `promql_expr_test` lists, against the rules already written to `tmp_path/rules.yaml`."""
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, **tests}],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = _run("test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_shipped_prometheus_rule_is_what_the_generator_makes_of_the_example_config() -> None:
    expected = render(prometheus_rule(example_rules()), CONFIG)
    assert SHIPPED.read_text() == expected, f"regenerate: llm-gateway alerts --config {CONFIG} > {SHIPPED}"
    shipped = find(rendered(), "PrometheusRule", "llm-gateway-slo")
    assert shipped["metadata"]["namespace"] == "llm-gateway"
    assert len(example_rules().alert_rules()) == 5  # four burn-rate alerts and the learned cap's


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param(load_settings(REPO / CONFIG, environ={}), id="example"),
        pytest.param(
            _settings(
                slo={"ttft_s": 1.7, "tpot_s": 0.001, "availability_excluded_outcomes": []},
                cost={"gpu_usd_per_hour": 3.1, "gpus_per_replica": 8},
                autoscale={"decode_tokens_per_s": 900, "b_max": 32},
            ),
            id="odd-bounds-cost-no-exclusions",
        ),
    ],
)
def test_promtool_accepts_the_rules(tmp_path: Path, settings: Settings) -> None:
    (tmp_path / "rules.yaml").write_text(render(rules_file(build_rules(settings, 'namespace="ml"')), "x"))
    result = _run("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    """The checker is real: a rule with a PromQL syntax error fails it."""
    document = rules_file(build_rules(_settings()))
    document["groups"][0]["rules"][1]["expr"] += " +"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(document))
    assert _run("check", "rules", "rules.yaml", cwd=tmp_path).returncode != 0


def _counter(segments: list[tuple[float, int]]) -> str:
    """promtool series notation for a counter growing by `per_min` for `minutes`, segment after segment."""
    total, parts = 0.0, []
    for per_min, minutes in segments:
        parts.append(f"{total:g}+{per_min:g}x{minutes}")
        total += per_min * (minutes + 1)
    return " ".join(parts)


def _burn(bad_ratio: float, start_min: int, minutes: int, end_min: int) -> tuple[list[Any], list[Any]]:
    """(bad, good) counter segments: all good, then `bad_ratio` bad for `minutes`, then good again.
    Each segment's first sample repeats the previous total plus one step, hence the −1 lengths."""
    good = [
        (PER_MIN, start_min),
        (PER_MIN * (1 - bad_ratio), minutes - 1),
        (PER_MIN, end_min - start_min - minutes - 1),
    ]
    bad = [(0, start_min), (PER_MIN * bad_ratio, minutes - 1), (0, end_min - start_min - minutes - 1)]
    return bad, good


def _series(slo: str, bad: list[Any], good: list[Any]) -> list[dict[str, str]]:
    m = f'model="{MODEL}"'
    if slo == "latency":
        total = [(b + g, n) for (b, n), (g, _) in zip(bad, good, strict=True)]
        return [
            {"series": f"llm_gateway_slo_requests_total{{{m}}}", "values": _counter(total)},
            {"series": f"llm_gateway_goodput_requests_total{{{m}}}", "values": _counter(good)},
        ]
    excluded = [(PER_MIN, n) for _, n in good]  # as many client errors as successes: they burn nothing
    return [
        {"series": f'llm_gateway_requests_total{{{m},outcome="success"}}', "values": _counter(good)},
        {"series": f'llm_gateway_requests_total{{{m},outcome="upstream_connect"}}', "values": _counter(bad)},
        {"series": f'llm_gateway_requests_total{{{m},outcome="bad_request"}}', "values": _counter(excluded)},
        {"series": f'llm_gateway_requests_total{{{m},outcome="rate_limited"}}', "values": _counter(excluded)},
    ]


def _expect(rules: RuleSet, slo: str, burn: str) -> tuple[str, dict[str, Any]]:
    rule = next(
        r for r in rules.alert_rules() if r["labels"].get("slo") == slo and r["labels"].get("burn") == burn
    )
    return rule["alert"], {"exp_labels": rule["labels"], "exp_annotations": rule["annotations"]}


@dataclass(frozen=True)
class Burn:
    """`bad` of the requests fail from minute `start` for `length` minutes (series end at `end`); the
    alert must fire at `firing` and be quiet at each of `quiet` (before the burn, and after it)."""

    slo: str
    burn: str
    bad: float
    start: int
    length: int
    end: int
    firing: int
    quiet: tuple[int, ...]


# Fast: 14.4x over 1h and 5m; slow: 6x over 6h and 30m, of a 1 % (latency) or 0.1 % (availability) budget.
# The slow burns (9 %, 1 %) are under the fast thresholds (14.4 %, 1.44 %).
BURNS = [
    Burn("latency", "fast", 0.5, 60, 30, 150, 85, (55, 105)),
    Burn("latency", "slow", 0.09, 60, 260, 400, 310, (55, 370)),
    Burn("availability", "fast", 0.05, 60, 30, 150, 85, (55, 105)),
    Burn("availability", "slow", 0.01, 60, 260, 400, 310, (55, 370)),
]


@pytest.mark.parametrize("case", BURNS, ids=lambda b: f"{b.slo}-{b.burn}")
def test_each_alert_fires_during_its_burn_and_resolves_after_it(tmp_path: Path, case: Burn) -> None:
    slo, burn, firing = case.slo, case.burn, case.firing
    rules = build_rules(_settings())
    (tmp_path / "rules.yaml").write_text(render(rules_file(rules), "x"))
    name, alert = _expect(rules, slo, burn)
    other_burn = "slow" if burn == "fast" else "fast"
    other_name, _ = _expect(rules, slo, other_burn)
    checks = [{"eval_time": f"{firing}m", "alertname": name, "exp_alerts": [alert]}]
    checks += [{"eval_time": f"{t}m", "alertname": name, "exp_alerts": []} for t in case.quiet]
    if burn == "slow":  # a slow burn is below the fast threshold: it pages nobody
        checks.append({"eval_time": f"{firing}m", "alertname": other_name, "exp_alerts": []})
    bad_segments, good_segments = _burn(case.bad, case.start, case.length, case.end)
    _promtool_test(tmp_path, _series(slo, bad_segments, good_segments), alert_rule_test=checks)


def test_a_pool_with_no_goodput_at_all_still_pages(tmp_path: Path) -> None:
    """Every request misses: the goodput counter never gets a series, and the alert must fire anyway."""
    rules = build_rules(_settings())
    (tmp_path / "rules.yaml").write_text(render(rules_file(rules), "x"))
    name, alert = _expect(rules, "latency", "fast")
    series = [{"series": f'llm_gateway_slo_requests_total{{model="{MODEL}"}}', "values": f"0+{PER_MIN}x30"}]
    checks = [{"eval_time": "10m", "alertname": name, "exp_alerts": [alert]}]
    _promtool_test(tmp_path, series, alert_rule_test=checks)


def test_the_learned_cap_alert_fires_after_fifteen_minutes_held_at_the_floor(tmp_path: Path) -> None:
    """Replica `a` is held from minute 0; `b` too, but let go for one minute at minute 8."""
    rules = build_rules(_settings())
    (tmp_path / "rules.yaml").write_text(render(rules_file(rules), "x"))
    (rule,) = [r for r in rules.alert_rules() if r["alert"] == "LLMGatewayLearnedCapHeldAtFloor"]

    def firing(replica: str) -> dict[str, Any]:
        annotations = {k: v.replace("{{ $labels.replica }}", replica) for k, v in rule["annotations"].items()}
        return {"exp_labels": {**rule["labels"], "replica": replica}, "exp_annotations": annotations}

    name = rule["alert"]
    series = [
        {"series": 'llm_gateway_learned_cap_held_at_floor{replica="a"}', "values": "1x40"},
        {"series": 'llm_gateway_learned_cap_held_at_floor{replica="b"}', "values": "1x7 0 1x32"},
    ]
    checks = [
        {"eval_time": "10m", "alertname": name, "exp_alerts": []},
        {"eval_time": "17m", "alertname": name, "exp_alerts": [firing("a")]},
        {"eval_time": "21m", "alertname": name, "exp_alerts": [firing("a")]},
        {"eval_time": "27m", "alertname": name, "exp_alerts": [firing("a"), firing("b")]},
    ]
    _promtool_test(tmp_path, series, alert_rule_test=checks)


def test_cost_rules_compute_the_documented_figures(tmp_path: Path) -> None:
    """Two gateway instances each see 3 replicas (2 ready, 1 down) and 500 goodput tok/s: the pool costs
    3 x 2 GPUs x $2.5/h, 1000 goodput tok/s -> $4.1667 per million; tenant a has 3/4 of the tokens."""
    rules = build_rules(_settings(cost={"gpu_usd_per_hour": 2.5, "gpus_per_replica": 2}))
    (tmp_path / "rules.yaml").write_text(render(rules_file(rules), "x"))
    series = []
    for instance in ("g1", "g2"):
        i = f'instance="{instance}"'
        series += [
            {"series": f'llm_gateway_replicas{{pool="{MODEL}",state="ready",{i}}}', "values": "2x20"},
            {"series": f'llm_gateway_replicas{{pool="{MODEL}",state="down",{i}}}', "values": "1x20"},
            {"series": f'llm_gateway_goodput_tokens_total{{model="{MODEL}",{i}}}', "values": "0+30000x20"},
            {"series": f'llm_gateway_tokens_total{{direction="output",{i}}}', "values": "0+12000x20"},
            {
                "series": f'llm_gateway_tenant_tokens_total{{tenant="a",direction="output",{i}}}',
                "values": "0+9000x20",
            },
            {
                "series": f'llm_gateway_tenant_tokens_total{{tenant="b",direction="output",{i}}}',
                "values": "0+3000x20",
            },
        ]
    cost_per_s = 3 * 2 * 2.5 / 3600
    expected = {
        f'llm_gateway:cost_usd_per_million_goodput_tokens:rate5m{{model="{MODEL}"}}': cost_per_s / 1000 * 1e6,
        f'llm_gateway:gpu_cost_usd_per_second{{model="{MODEL}"}}': cost_per_s,
        'llm_gateway:tenant_cost_usd_per_second:rate5m{tenant="a"}': cost_per_s * 0.75,
    }
    exprs = [  # in millionths: promtool compares floats exactly
        {
            "expr": f"round({series_name} * 1e6)",
            "eval_time": "15m",
            "exp_samples": [{"labels": "{" + series_name.split("{")[1], "value": round(value * 1e6)}],
        }
        for series_name, value in expected.items()
    ]
    _promtool_test(tmp_path, series, promql_expr_test=exprs)
