"""Engine load scraping through the running gateway: the mock engine's /metrics reach the replica
views and the exported gauges, and routing sees them."""

from __future__ import annotations

import time

import httpx

from tests.integration.conftest import MODEL, pool
from tests.servers import gateway_settings


def test_scraped_engine_load_reaches_the_registry_and_metrics(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=20)
    gateway = gateways(gateway_settings([pool([engine], scrape={"interval_s": 0.05, "timeout_s": 0.04})]))
    replica = next(gateway.app.state.registry.all_replicas())
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 300, "stream": True}
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", gateway.url + "/v1/chat/completions", json=body),
    ):
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and (replica.engine is None or replica.engine.running < 1):
            time.sleep(0.02)
        assert replica.engine is not None and replica.engine.running == 1 and not replica.engine.stale
        text = client.get(gateway.url + "/metrics").text
        assert f'llm_gateway_replica_engine_running{{replica="{replica.replica_id}"}} 1.0' in text
        assert "llm_gateway_replica_kv_usage_ratio" in text


def test_dead_engine_metrics_count_as_scrape_errors(gateways) -> None:
    from tests.servers import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    settings = gateway_settings(
        [{"model": MODEL, "replicas": {"static": [dead]}, "scrape": {"interval_s": 0.05, "timeout_s": 0.04}}]
    )
    gateway = gateways(settings)
    deadline = time.monotonic() + 3
    text = ""
    while time.monotonic() < deadline:
        text = httpx.get(gateway.url + "/metrics").text
        if 'reason="connect"' in text:
            break
        time.sleep(0.05)
    assert 'reason="connect"' in text
