"""The autoscaling signal through a running gateway: exported per pool, fed by real traffic."""

from __future__ import annotations

import asyncio

import httpx

from tests.integration.conftest import MODEL, pool
from tests.servers import gateway_settings
from tests.waiting import wait_for


def test_desired_replicas_is_exported_and_grows_under_queue_pressure(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=5)
    autoscale = {"decode_tokens_per_s": 400, "evaluation_period_s": 0.5, "window_s": 2}
    gateway = gateways(gateway_settings([pool([engine], max_concurrency_per_replica=2, autoscale=autoscale)]))
    signals = gateway.app.state.signals

    async def load() -> None:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=20) as client:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 40}
            await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(24)))

    asyncio.run(load())

    def desired_replicas() -> float | None:
        """The exported desired count after a sample on the gateway's loop (an evaluation runs once
        `evaluation_period_s` has passed since the last one; None until the first)."""
        gateway.call(_sample(signals))
        prefix = f'llm_gateway_desired_replicas{{pool="{MODEL}"}}'
        lines = [
            line for line in httpx.get(gateway.url + "/metrics").text.splitlines() if line.startswith(prefix)
        ]
        return float(lines[0].split()[-1]) if lines else None

    # Scale-up applies at once and scale-down only after a full window plus a cooldown, so once the
    # queue pressure has been evaluated the exported count stays where it went.
    wait_for(
        lambda: (desired_replicas() or 0) >= 2,
        timeout_s=3,
        interval_s=0.05,
        what="a queue of 20+ behind a cap of 2 asks for more than one replica",
    )
    text = httpx.get(gateway.url + "/metrics").text
    assert "llm_gateway_autoscale_reason" in text and "llm_gateway_autoscale_arrival_rate_per_second" in text


async def _sample(signals) -> None:
    signals.sample_and_export()
