"""deploy/grafana/llm-gateway.json: valid dashboard JSON whose every PromQL expression names only
metrics the gateway exports (gateway/base/metrics.py and its families' modules, parsed), that
ALLOWED_METRICS lists (incl. planned), or that the recording rules generated for the example config write
(gateway/fleet/alert_rules.py, shipped as deploy/kubernetes/prometheusrule.yaml)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import example_rules
from tests.deploy.tools import REPO, require_executable

DASHBOARD = REPO / "deploy" / "grafana" / "llm-gateway.json"
METRICS_MODULES = [
    REPO / "gateway" / "base" / name
    for name in (
        "metric_naming.py",
        "metrics.py",
        "request_metrics.py",
        "dispatch_metrics.py",
        "replica_metrics.py",
    )
]
"""`GatewayMetrics` and the modules of its families; `metric_naming.py` holds the prefix."""

ALLOWED_METRICS: dict[str, str] = {
    # The metrics a dashboard expression may name (name -> kind; histograms also allow _bucket/_sum/_count).
    # The names that gateway/base/metrics.py defines are ALSO parsed from its source (exported_metrics below),
    # so a metric added there is allowed at once; this constant keeps the names the dashboard was built
    # on, including planned ones that other work adds, and a test checks that any of them that metrics.py
    # defines has the same kind there. Remove a planned name here only together with its panels.
    # -- defined in gateway/base/metrics.py when the dashboard was written
    "llm_gateway_requests_total": "counter",
    "llm_gateway_request_duration_seconds": "histogram",
    "llm_gateway_ttft_seconds": "histogram",
    "llm_gateway_tpot_seconds": "histogram",
    "llm_gateway_inflight": "gauge",
    "llm_gateway_replica_up": "gauge",
    "llm_gateway_routing_decisions_total": "counter",
    "llm_gateway_routing_decision_seconds": "histogram",
    "llm_gateway_retries_total": "counter",
    "llm_gateway_rejections_total": "counter",
    "llm_gateway_tokens_total": "counter",
    # -- planned (admission, engine scraping, breakers, goodput, autoscaling, discovery)
    "llm_gateway_queue_depth": "gauge",
    "llm_gateway_queue_wait_seconds": "histogram",
    "llm_gateway_replica_engine_running": "gauge",
    "llm_gateway_replica_engine_waiting": "gauge",
    "llm_gateway_replica_kv_usage_ratio": "gauge",
    "llm_gateway_breaker_state": "gauge",
    "llm_gateway_goodput_tokens_total": "counter",
    "llm_gateway_desired_replicas": "gauge",
    "llm_gateway_scrape_errors_total": "counter",
    "llm_gateway_replicas": "gauge",  # by state: ready | draining | down
}

PROMQL_WORDS = {
    # functions and aggregations the dashboard may use
    "sum", "min", "max", "avg", "count", "topk", "bottomk", "quantile", "stddev", "group",
    "rate", "irate", "increase", "delta", "deriv", "histogram_quantile", "clamp_min", "clamp_max",
    "clamp", "abs", "ceil", "floor", "round", "vector", "scalar", "time", "label_replace",
    "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "absent",
    # keywords
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
}  # fmt: skip
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def exported_metrics() -> dict[str, str]:
    """Metric name → kind from the Counter/Gauge/Histogram/Summary constructors in `METRICS_MODULES`."""
    trees = [ast.parse(module.read_text()) for module in METRICS_MODULES]
    constants = {
        node.targets[0].id: node.value.value
        for tree in trees
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }
    found: dict[str, str] = {}
    for node in (node for tree in trees for node in ast.walk(tree)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        kind = node.func.id.lower()
        if kind not in ("counter", "gauge", "histogram", "summary"):
            continue
        name = _string_value(node.args[0], constants)
        if name is not None:
            found[name] = kind
    return found


def _string_value(node: ast.expr, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
                parts.append(constants[value.value.id])
            else:
                return None
        return "".join(parts)
    return None


def allowed_series() -> set[str]:
    names = example_rules().recorded_names()
    for name, kind in {**ALLOWED_METRICS, **exported_metrics()}.items():
        names.add(name)
        if kind in ("histogram", "summary"):
            names.update(name + suffix for suffix in HISTOGRAM_SUFFIXES)
    return names


def _expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            # Grafana's label_values(<series selector>, <label>): the selector is PromQL
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", query["query"].strip())
            out.append((f"${variable['name']}", match.group(1) if match else query["query"]))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers left after removing strings, label matchers,
    grouping clauses, range/offset durations and numbers, that are not PromQL words."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)
    text = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", "", text)
    identifiers = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
    return identifiers - PROMQL_WORDS


def test_metrics_module_is_parsed() -> None:
    exported = exported_metrics()
    assert exported["llm_gateway_requests_total"] == "counter"
    assert exported["llm_gateway_ttft_seconds"] == "histogram"
    assert len(exported) >= 10


def test_allowed_names_follow_the_conventions_and_agree_with_metrics_py() -> None:
    exported = exported_metrics()
    for name, kind in ALLOWED_METRICS.items():
        assert name.startswith("llm_gateway_")
        assert name.endswith("_total") == (kind == "counter"), name
        if name in exported:
            assert exported[name] == kind, (
                f"{name} is a {exported[name]} in gateway/base/metrics.py, not a {kind}"
            )


def test_recording_rule_names_come_from_the_generator() -> None:
    """Only what the example config's rules record is allowed beside the exported metrics: a rule name
    the generator does not write (a window the config lacks) is refused."""
    allowed = allowed_series()
    assert "llm_gateway:slo_burn_rate:rate1h" in allowed
    assert "llm_gateway:slo_burn_rate:rate2h" not in allowed


def test_metric_name_extraction() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, model) "
        '(rate(llm_gateway_ttft_seconds_bucket{model=~"$model"}[5m])))'
    )
    assert metric_names(expr) == {"llm_gateway_ttft_seconds_bucket"}
    assert metric_names('sum(vllm:num_requests_running{x="a b"}) / up') == {"vllm:num_requests_running", "up"}


def test_every_expression_names_only_known_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    allowed = allowed_series()
    expressions = _expressions(dashboard)
    assert len(expressions) >= 30
    problems = []
    for where, expr in expressions:
        names = metric_names(expr)
        if not names:
            problems.append(f"{where}: no metric in {expr!r}")
        problems += [f"{where}: unknown metric {name!r}" for name in sorted(names - allowed)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "topic",
    [
        "llm_gateway_requests_total",
        "llm_gateway_ttft_seconds_bucket",
        "llm_gateway_tpot_seconds_bucket",
        "llm_gateway_request_duration_seconds_bucket",
        "llm_gateway_goodput_tokens_total",
        "llm_gateway_queue_depth",
        "llm_gateway_queue_wait_seconds_bucket",
        "llm_gateway_inflight",
        "llm_gateway_replica_engine_running",
        "llm_gateway_replica_engine_waiting",
        "llm_gateway_replica_kv_usage_ratio",
        "llm_gateway_routing_decisions_total",
        "llm_gateway_retries_total",
        "llm_gateway_breaker_state",
        "llm_gateway_desired_replicas",
        "llm_gateway_replicas",
        "llm_gateway_replica_up",
        "llm_gateway_scrape_errors_total",
        "llm_gateway_rejections_total",
        "llm_gateway_rejection_duration_seconds_bucket",
        "llm_gateway_tokens_total",
        "llm_gateway_tenant_tokens_total",
        "llm_gateway:slo_burn_rate:rate1h",
        "llm_gateway:slo_burn_rate:rate5m",
        "llm_gateway:slo_burn_rate:rate6h",
        "llm_gateway:slo_burn_rate:rate30m",
        "llm_gateway:slo_error_ratio:rate5m",
        "llm_gateway:cost_usd_per_million_goodput_tokens:rate5m",
        "llm_gateway:cost_usd_per_million_tokens_at_b_max",
        "llm_gateway:tenant_cost_usd_per_second:rate5m",
    ],
)
def test_dashboard_covers(topic: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert any(topic in metric_names(expr) for _, expr in _expressions(dashboard))


def test_dashboard_shape() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "llm-gateway" and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
    quantile_exprs = [e for _, e in _expressions(dashboard) if "histogram_quantile" in e]
    assert all("le" in re.findall(r"by \(([^)]*)\)", e)[0] for e in quantile_exprs)


def test_every_expression_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each expression (Grafana's variables replaced by values) as a recording rule."""
    promtool = require_executable("promtool", "prometheus", how="make install-deploy-tools")
    rules = [
        {
            "record": f"dashboard:expr_{i}",
            "expr": expr.replace("$__rate_interval", "5m").replace("$model", ".*"),
        }
        for i, (_, expr) in enumerate(_expressions(json.loads(DASHBOARD.read_text())))
    ]
    (tmp_path / "dashboard.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    result = subprocess.run(
        [promtool, "check", "rules", "dashboard.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
