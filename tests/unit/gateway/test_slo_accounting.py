"""The latency SLO's two counters: `slo_requests_total` (every success the goodput test ran on) and
`goodput_requests_total` (those that met the SLO); successes without a completion token count are in
neither, so an embeddings success never reads as an SLO miss."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import PoolSettings
from gateway.config.slo_settings import KNOWN_OUTCOMES
from gateway.proxy.account import OUTCOME_CLIENT_DISCONNECT, OUTCOME_SUCCESS, ServeMetrics
from gateway.proxy.reply import Reply
from gateway.upstream.registry import Pool

MODEL = "m"


async def _send(message: Any) -> None:
    return None


def _pool() -> Pool:
    settings = PoolSettings.model_validate(
        {"model": MODEL, "replicas": {"static": ["http://127.0.0.1:1"]}, "slo": {"ttft_s": 1, "tpot_s": 0.1}}
    )
    return cast(Pool, SimpleNamespace(model=MODEL, settings=settings))


def _reply(*, ttft_s: float, usage: dict[str, int] | None) -> Reply:
    reply = Reply(request_id="r", send=_send, clock=FakeClock())
    reply.first_output_s = ttft_s
    reply.usage = usage
    return reply


def _counts(metrics: GatewayMetrics) -> tuple[float, float]:
    def value(name: str) -> float:
        found = metrics.registry.get_sample_value(name, {"model": MODEL})
        return 0.0 if found is None else found

    return value("llm_gateway_slo_requests_total"), value("llm_gateway_goodput_requests_total")


@pytest.mark.parametrize(
    ("ttft_s", "usage", "outcome", "expected"),
    [
        (0.5, {"prompt_tokens": 5, "completion_tokens": 1}, OUTCOME_SUCCESS, (1.0, 1.0)),
        (1.5, {"prompt_tokens": 5, "completion_tokens": 1}, OUTCOME_SUCCESS, (1.0, 0.0)),
        (0.5, {"prompt_tokens": 5}, OUTCOME_SUCCESS, (0.0, 0.0)),  # embeddings: no completion tokens
        (0.5, {"prompt_tokens": 5, "completion_tokens": 1}, "upstream_connect", (0.0, 0.0)),
    ],
)
def test_slo_total_counts_the_requests_the_goodput_test_ran_on(
    ttft_s: float, usage: dict[str, int], outcome: str, expected: tuple[float, float]
) -> None:
    metrics = GatewayMetrics()
    ServeMetrics(metrics).finished(
        _reply(ttft_s=ttft_s, usage=usage), outcome, tenant=None, pool=_pool(), stream=True
    )
    assert _counts(metrics) == expected


def test_the_settings_know_every_outcome_the_handler_records() -> None:
    assert OUTCOME_CLIENT_DISCONNECT in KNOWN_OUTCOMES
    assert OUTCOME_SUCCESS not in KNOWN_OUTCOMES
