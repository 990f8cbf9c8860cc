"""Where the engine scraper (`gateway.upstream.scraper`) reports: the labelled gauges and counter it
sets per replica (`ScrapeMetrics`, every part optional), typed as the small protocols a
`prometheus_client` family fits, so the scraper needs no registry of its own (the gateway owns it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class GaugeChild(Protocol):
    def set(self, value: float) -> None: ...


class GaugeFamily(Protocol):
    """A labelled gauge (a `prometheus_client.Gauge` with label `replica` fits)."""

    def labels(self, *labelvalues: str) -> GaugeChild: ...

    def remove(self, *labelvalues: str) -> None: ...


class CounterChild(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class CounterFamily(Protocol):
    """A labelled counter (a `prometheus_client.Counter` with labels `replica, reason` fits)."""

    def labels(self, *labelvalues: str) -> CounterChild: ...


@dataclass(frozen=True, slots=True)
class ScrapeMetrics:
    """Where the scraper reports; every part optional. The gateway owns the registry."""

    errors: CounterFamily | None = None
    running: GaugeFamily | None = None
    waiting: GaugeFamily | None = None
    kv_usage_ratio: GaugeFamily | None = None
    prefix_cache_hit_ratio: GaugeFamily | None = None
    learned_cap: GaugeFamily | None = None
    """The target's learned cap after each fresh sample (0: none)."""
    learned_set_point: GaugeFamily | None = None
    """The token latency (seconds) the target's learned cap steers to (0: no fast samples)."""
    learned_floor: GaugeFamily | None = None
    """1 while the target's learned cap is held near its floor with the latency over its set point."""
    lora_adapters: GaugeFamily | None = None
    """Labels (replica, state): how many LoRA adapters have `running` / `waiting` requests."""
