"""The few PromQL text pieces the rule generators share: durations, numbers and label selectors."""

from __future__ import annotations

from typing import Any

Rule = dict[str, Any]
"""One Prometheus rule as it is written out: `record` or `alert`, `expr`, `for`, `labels`, `annotations`."""


def duration(seconds: int) -> str:
    """A Prometheus duration in its largest whole unit: 3600 → `1h`, 1800 → `30m`, 90 → `90s`."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def number(value: float) -> str:
    """A float without binary noise: 1 − 0.99 → `0.01`, 6.0 → `6`."""
    return format(value, ".12g")


def selector(extra: str = "", *, outcome_not: str | None = None, **labels: str) -> str:
    """`{model="m",outcome!~"a|b",<extra>}`: equality matchers, an optional negative outcome regex, and
    `extra` (raw PromQL matchers, e.g. `namespace="prod"`) last; empty when there is no matcher."""
    parts = [f'{name}="{_escape(value)}"' for name, value in labels.items()]
    if outcome_not:
        parts.append(f'outcome!~"{_escape(outcome_not)}"')
    if extra.strip():
        parts.append(extra.strip().strip(","))
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
