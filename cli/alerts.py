"""`llm-gateway alerts --config FILE`: print the Prometheus rules derived from the config's pools — SLO
recording rules, multi-window burn-rate alerts and cost per goodput token (gateway/fleet/alert_rules.py) — as
a Prometheus Operator `PrometheusRule` (default) or a plain rules file (`--format rules`).

Warnings (an SLO bound that is not a histogram bucket edge) go to stderr. Exit codes: 0 ok, 2 an invalid
config.
"""

from __future__ import annotations

import argparse
import sys

from gateway.config.settings import ConfigError, load_settings
from gateway.fleet.alert_rules import PROMETHEUS_RULE_NAME, build_rules, prometheus_rule, render, rules_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config file (default: $LLM_GATEWAY_CONFIG)")
    parser.add_argument(
        "--format",
        choices=("prometheus-rule", "rules"),
        default="prometheus-rule",
        help="a PrometheusRule object (default) or a plain rules file for rule_files / promtool",
    )
    parser.add_argument(
        "--selector",
        default="",
        help='extra PromQL label matchers for every selector, e.g. namespace="ml" (one deployment\'s series)',
    )
    parser.add_argument("--name", default=PROMETHEUS_RULE_NAME, help="the PrometheusRule's metadata.name")


def run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"llm-gateway: {exc}", file=sys.stderr)
        return 2
    rules = build_rules(settings, args.selector)
    for warning in rules.warnings:
        print(f"llm-gateway: warning: {warning}", file=sys.stderr)
    document = rules_file(rules) if args.format == "rules" else prometheus_rule(rules, args.name)
    sys.stdout.write(render(document, args.config or "$LLM_GATEWAY_CONFIG"))
    return 0
