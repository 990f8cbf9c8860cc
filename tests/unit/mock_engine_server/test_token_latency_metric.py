"""The mock's inter-token latency histogram is in wall seconds, as a real engine's is."""

from __future__ import annotations

import httpx
import pytest

from mock_engine.config import MockEngineConfig
from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.server import MockEngineApp
from tests.servers import ServerThread

MODEL = "itl-model"
TOKEN_DELAY_S = 0.02  # simulated


def _histogram(text: str, name: str) -> tuple[float, float]:
    values = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_sum") or line.startswith(f"{name}_count"):
            key, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
            values[key] = value
    return values[f"{name}_sum"], values[f"{name}_count"]


@pytest.mark.parametrize("speed", [1.0, 4.0])
def test_the_histogram_sum_is_simulated_gaps_scaled_to_wall_time(speed: float) -> None:
    config = MockEngineConfig(model=MODEL, default_max_tokens=8, speed=speed)
    app = MockEngineApp(config, FixedDelayCore(0.001, TOKEN_DELAY_S), FaultSettings())
    server = ServerThread(app, "mock-engine-itl").start()
    try:
        with httpx.Client(timeout=10.0) as client:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
            assert client.post(server.url + "/v1/chat/completions", json=body).status_code == 200
            total_s, count = _histogram(
                client.get(server.url + "/metrics").text, "vllm:inter_token_latency_seconds"
            )
    finally:
        server.stop()
    assert count == 5, "six tokens, five gaps"
    assert total_s == pytest.approx(5 * TOKEN_DELAY_S / speed)
