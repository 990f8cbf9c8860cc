"""Prometheus recording and alerting rules derived from the pools' SLOs (`llm-gateway alerts`).

Everything is computed from what the gateway exports (gateway/base/metrics.py), summed over every gateway
instance, per pool (each rule carries the label `model="<pool>"`). For each window w of the pool's
`slo.burn_rate_alerts` (default 5m, 1h, 30m, 6h):

  llm_gateway:slo_error_ratio:rate<w>{slo="latency"}
      = 1 − Σ rate(llm_gateway_goodput_requests_total[w]) / Σ rate(llm_gateway_slo_requests_total[w])
        (the requests the goodput test ran on that missed TTFT or TPOT; gateway/proxy/account.py)
  llm_gateway:slo_error_ratio:rate<w>{slo="availability"}
      = Σ rate(llm_gateway_requests_total{outcome!~"success|<excluded>"}[w])
        / Σ rate(llm_gateway_requests_total{outcome!~"<excluded>"}[w])
        (excluded: `slo.availability_excluded_outcomes`, which count neither way)
  llm_gateway:slo_burn_rate:rate<w>{slo} = error ratio / (1 − objective)
  llm_gateway:slo_objective:ratio{slo}   = the objective, a constant (for panels)

A numerator with no series yet (no goodput at all, no failure yet) counts as 0 (`or vector(0)`), so a
pool whose every request misses still alerts; no traffic at all gives no value and no alert.

Each alert a = (name, burn rate b, long window L, short window S, severity) of each SLO becomes
`LLMGateway{Latency|Availability}BudgetBurn{Name}`, firing while
`burn_rate:rate<L> > b and burn_rate:rate<S> > b` (SRE workbook, multi-window multi-burn-rate), with
the labels `severity`, `slo`, `burn` (= a.name) and `model`.

Diagnostics (no alert): `llm_gateway:slo_ttft_within_bound:ratio_rate5m{le}` and
`llm_gateway:slo_tpot_within_bound:ratio_rate5m{le}`, the fraction of requests at or under each bound,
read from the histograms. A histogram answers only at its bucket edges: a bound that is not one is
rounded DOWN to the largest edge below it (conservative: the panel under-reports compliance, never hides
a miss) with a warning, and a bound below the smallest edge gets no diagnostic rule (warning too). The
alerts are not affected: they use the goodput counter, tested in-process against the exact bounds.

Cost rules: gateway/fleet/alert_rules_cost.py. The learned cap held at its floor (a ticket, once for
the fleet): gateway/fleet/alert_rules_learned_cap.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from prometheus_client import Histogram

from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import PoolSettings, Settings
from gateway.config.slo_settings import BurnRateAlert, SloSettings
from gateway.fleet.alert_rules_cost import pool_cost_rules, tenant_cost_rules
from gateway.fleet.alert_rules_learned_cap import learned_cap_rules
from gateway.fleet.alert_rules_promql import Rule, duration, number, selector

DIAGNOSTIC_WINDOW_S = 300
"""The window of the per-bound diagnostic ratios (and the cost rates): the dashboard's resolution."""
PROMETHEUS_RULE_NAME = "llm-gateway-slo"
SLO_KINDS = ("latency", "availability")


@dataclass
class RuleSet:
    """The generated rule groups and the warnings met while generating them."""

    groups: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def recorded_names(self) -> set[str]:
        """Every series name a recording rule of this set writes."""
        return {rule["record"] for group in self.groups for rule in group["rules"] if "record" in rule}

    def alert_rules(self) -> list[dict[str, Any]]:
        return [rule for group in self.groups for rule in group["rules"] if "alert" in rule]


def error_ratio_name(window_s: int) -> str:
    return f"llm_gateway:slo_error_ratio:rate{duration(window_s)}"


def burn_rate_name(window_s: int) -> str:
    return f"llm_gateway:slo_burn_rate:rate{duration(window_s)}"


def alert_name(slo_kind: str, alert: BurnRateAlert) -> str:
    """`LLMGatewayLatencyBudgetBurnFast` for the latency SLO's `fast` alert."""
    words = "".join(part.capitalize() for part in alert.name.split("_"))
    return f"LLMGateway{slo_kind.capitalize()}BudgetBurn{words}"


def build_rules(settings: Settings, extra_matchers: str = "") -> RuleSet:
    """The rule groups for every pool of `settings` (module docstring); `extra_matchers` (PromQL label
    matchers such as `namespace="prod"`) narrows every selector to one deployment's series."""
    rules = RuleSet()
    for pool in settings.pools:
        group: list[Rule] = []
        group += _slo_rules(pool, extra_matchers)
        group += _diagnostic_rules(pool, extra_matchers, rules.warnings)
        group += pool_cost_rules(pool, extra_matchers, DIAGNOSTIC_WINDOW_S)
        group += _alerts(pool)
        rules.groups.append({"name": f"llm-gateway-slo:{pool.model}", "rules": group})
    tenants = tenant_cost_rules(settings.pools, extra_matchers, DIAGNOSTIC_WINDOW_S)
    if tenants:
        rules.groups.append({"name": "llm-gateway-cost:tenants", "rules": tenants})
    learned_cap = learned_cap_rules(settings.pools, extra_matchers)
    if learned_cap:
        rules.groups.append({"name": "llm-gateway-learned-cap", "rules": learned_cap})
    return rules


def _windows(slo: SloSettings) -> list[int]:
    return sorted({w for a in slo.burn_rate_alerts for w in (a.short_window_s, a.long_window_s)})


def _objectives(slo: SloSettings) -> dict[str, float]:
    return {"latency": slo.objective_ratio, "availability": slo.availability_objective_ratio}


def _has_latency_slo(slo: SloSettings) -> bool:
    return slo.ttft_s is not None or slo.tpot_s is not None


def _slo_kinds(slo: SloSettings) -> list[str]:
    return [kind for kind in SLO_KINDS if kind == "availability" or _has_latency_slo(slo)]


def _slo_rules(pool: PoolSettings, extra: str) -> list[Rule]:
    slo, model = pool.slo, pool.model
    pool_sel = selector(extra, model=model)
    excluded = "|".join(sorted(slo.availability_excluded_outcomes))
    valid_sel = selector(extra, model=model, outcome_not=excluded) if excluded else pool_sel
    failed_sel = selector(extra, model=model, outcome_not="|".join(filter(None, ("success", excluded))))
    out: list[Rule] = []
    for kind in _slo_kinds(slo):
        labels = {"model": model, "slo": kind}
        objective = number(_objectives(slo)[kind])
        out.append({"record": "llm_gateway:slo_objective:ratio", "expr": objective, "labels": labels})
        for window_s in _windows(slo):
            w = duration(window_s)
            if kind == "latency":
                expr = (
                    f"1 - (sum(rate(llm_gateway_goodput_requests_total{pool_sel}[{w}])) or vector(0))"
                    f" / sum(rate(llm_gateway_slo_requests_total{pool_sel}[{w}]))"
                )
            else:
                expr = (
                    f"(sum(rate(llm_gateway_requests_total{failed_sel}[{w}])) or vector(0))"
                    f" / sum(rate(llm_gateway_requests_total{valid_sel}[{w}]))"
                )
            budget = number(1 - _objectives(slo)[kind])
            out.append({"record": error_ratio_name(window_s), "expr": expr, "labels": labels})
            out.append(
                {
                    "record": burn_rate_name(window_s),
                    "expr": f'{error_ratio_name(window_s)}{{model="{model}",slo="{kind}"}} / {budget}',
                    "labels": labels,
                }
            )
    return out


def _alerts(pool: PoolSettings) -> list[Rule]:
    slo, model = pool.slo, pool.model
    out: list[Rule] = []
    for kind in _slo_kinds(slo):
        objective = _objectives(slo)[kind]
        for alert in slo.burn_rate_alerts:
            rate, long_w, short_w = number(alert.burn_rate), alert.long_window_s, alert.short_window_s
            own = f'{{model="{model}",slo="{kind}"}}'
            threshold_pct = number(round(alert.burn_rate * (1 - objective) * 100, 6))
            what = "missed the TTFT/TPOT bounds" if kind == "latency" else "failed"
            out.append(
                {
                    "alert": alert_name(kind, alert),
                    "expr": (
                        f"{burn_rate_name(long_w)}{own} > {rate} and {burn_rate_name(short_w)}{own} > {rate}"
                    ),
                    "labels": {"severity": alert.severity, "slo": kind, "burn": alert.name, "model": model},
                    "annotations": {
                        "summary": f"{model}: {kind} error budget burning {rate}x too fast",
                        "description": (
                            f"Over both the last {duration(long_w)} and {duration(short_w)}, more than "
                            f"{threshold_pct}% of the pool's requests {what} ({rate} x the budget of the "
                            f"{number(objective)} objective). At this rate a 30-day budget lasts "
                            f"{number(round(30 / alert.burn_rate, 1))} days."
                        ),
                    },
                }
            )
    return out


def _diagnostic_rules(pool: PoolSettings, extra: str, warnings: list[str]) -> list[Rule]:
    metrics = GatewayMetrics()
    out: list[Rule] = []
    w = duration(DIAGNOSTIC_WINDOW_S)
    for key, bound, histogram in (
        ("ttft_s", pool.slo.ttft_s, metrics.ttft_seconds),
        ("tpot_s", pool.slo.tpot_s, metrics.tpot_seconds),
    ):
        if bound is None:
            continue
        name = f"llm_gateway_{key[:4]}_seconds"
        edge = bucket_edge(bound, bucket_edges(histogram))
        where = f"pools[{pool.model}].slo.{key}"
        if edge is None:
            warnings.append(f"{where} {number(bound)} is below every bucket of {name}: no diagnostic rule")
            continue
        edge_s, le = edge
        if edge_s != bound:
            warnings.append(
                f"{where} {number(bound)} is not a bucket edge of {name}: its diagnostic ratio uses "
                f'le="{le}" (rounded down; the alerts use the exact bound)'
            )
        sel, bucket_sel = selector(extra, model=pool.model), selector(extra, model=pool.model, le=le)
        out.append(
            {
                "record": f"llm_gateway:slo_{key[:4]}_within_bound:ratio_rate{w}",
                "expr": f"sum(rate({name}_bucket{bucket_sel}[{w}])) / sum(rate({name}_count{sel}[{w}]))",
                "labels": {"model": pool.model, "le": le},
            }
        )
    return out


def bucket_edges(histogram: Histogram) -> list[tuple[float, str]]:
    """The finite bucket edges of a histogram labelled by model, and their `le` text, as exported."""
    histogram.labels("probe")
    edges = {
        (float(sample.labels["le"]), sample.labels["le"])
        for family in histogram.collect()
        for sample in family.samples
        if sample.name.endswith("_bucket") and sample.labels["le"] != "+Inf"
    }
    return sorted(edges)


def bucket_edge(bound: float, edges: list[tuple[float, str]]) -> tuple[float, str] | None:
    """The largest edge ≤ `bound` (an edge within 1e-9 relative of it counts as equal), or None."""
    below = [edge for edge in edges if edge[0] <= bound * (1 + 1e-9)]
    if not below:
        return None
    edge_s, le = below[-1]
    return (bound, le) if abs(edge_s - bound) <= bound * 1e-9 else (edge_s, le)


def rules_file(rules: RuleSet) -> dict[str, Any]:
    """The plain Prometheus rules file (`rule_files:`, `promtool check rules`)."""
    return {"groups": rules.groups}


def prometheus_rule(rules: RuleSet, name: str = PROMETHEUS_RULE_NAME) -> dict[str, Any]:
    """The Prometheus Operator `PrometheusRule` holding the same groups."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "llm-gateway"}},
        "spec": {"groups": rules.groups},
    }


def render(document: dict[str, Any], config_path: str) -> str:
    """YAML text with a header naming the command that regenerates it."""
    header = (
        f"# Generated by `llm-gateway alerts --config {config_path}` from the pools' slo and cost settings\n"
        "# (gateway/fleet/alert_rules.py): do not edit, regenerate.\n"
    )
    body = yaml.dump(document, Dumper=_NoAliases, sort_keys=False, width=10_000, allow_unicode=True)
    return header + body


class _NoAliases(yaml.SafeDumper):
    """Rules share label dicts; write each out in full instead of as `&id001` anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
