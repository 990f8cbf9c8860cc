"""Canned runs for the sweep tests: a `RunResult` summarised from hand-made samples whose window and
outcomes are exact, so its goodput, refusals and shares are known numbers."""

from __future__ import annotations

from bench.sample import Sample
from bench.stats import Slo
from bench.summary import RunResult, summarize

SLO = Slo(ttft_s=2.0, tpot_s=0.05)


def canned_run(
    label: str,
    rate: float,
    *,
    met: int,
    missed: int = 0,
    at_arrival: int = 0,
    after_waiting: int = 0,
    window_s: float = 10.0,
    hit: float | None = None,
) -> RunResult:
    """`met` answers within the SLO and `missed` over its TTFT, each sent at 0 and lasting the whole
    `window_s` (one output token: judged on TTFT alone), then refusals: `at_arrival` `queue_full` and
    `after_waiting` `queue_timeout` 429s. Goodput = met ÷ window_s."""
    samples: list[Sample] = []
    for ttft_s, count in ((0.1, met), (5.0, missed)):
        for _ in range(count):
            samples.append(Sample(len(samples), 0.0, 0.0, 200, True, window_s, ttft_s, None, 1))
    for reason, count in (("queue_full", at_arrival), ("queue_timeout", after_waiting)):
        for _ in range(count):
            samples.append(Sample(len(samples), 0.0, 0.0, 429, False, 0.001, reject_reason=reason))
    summary = summarize(samples, SLO)
    summary["engine"] = {"prefix_cache_hit_ratio": hit} if hit is not None else {}
    summary["gpus"] = 2
    return RunResult(label, rate, "rate", samples, summary)
