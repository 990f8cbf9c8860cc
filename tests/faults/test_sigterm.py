"""Gateway SIGTERM with 120 open streams: the real `llm-gateway serve` process drains — readiness goes
false, new requests get 503 `draining`, every open stream finishes — and exits by itself.

The listener stays open only while requests are in flight, so one long stream (`ANCHOR_TOKENS`, about
4 s) keeps the drain going while the test probes it: without it a slow host could finish the 120 short
streams before the probes and the probes would meet a closed port (as a CI run once did)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.faults.conftest import MATRIX
from tests.faults.traffic import MODEL, VIOLATIONS, run_traffic, tally
from tests.servers import free_port

STREAMS = 120
ANCHOR_TOKENS = 160
"""The anchor stream's length: 160 tokens × 25 ms ≈ 4 s, well inside `drain_timeout_s` (10 s)."""


def _wait_ready(url: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("gateway did not become ready")


def test_sigterm_drains_120_open_streams(mock_engines, tmp_path: Path) -> None:
    engines = [mock_engines(model=MODEL, token_delay_ms=25) for _ in range(2)]
    port = free_port()
    config = {
        "server": {"host": "127.0.0.1", "port": port, "drain_timeout_s": 10, "readiness_propagation_s": 2},
        "pools": [
            {"model": MODEL, "replicas": {"static": [e.url for e in engines]}, "scrape": {"enabled": False}}
        ],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(json.dumps(config))
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--config", str(path), "--log-level", "warning"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url)

        async def scenario() -> tuple[list, httpx.Response, int]:
            anchor = asyncio.create_task(run_traffic(url, 1, max_tokens=ANCHOR_TOKENS, client_timeout_s=20))
            traffic = asyncio.create_task(run_traffic(url, STREAMS, max_tokens=40, client_timeout_s=20))
            await asyncio.sleep(0.6)
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient(base_url=url, timeout=5) as client:
                refused = await client.post(
                    "/v1/chat/completions",
                    json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                )
                ready = (await client.get("/readyz")).status_code
            assert tally(await anchor) == {"ok": 1}, "the anchor stream finishes too"
            return await traffic, refused, ready

        outcomes, refused, ready = asyncio.run(scenario())
        assert refused.status_code == 503 and refused.headers["x-gateway-reject-reason"] == "draining"
        assert int(refused.headers["retry-after"]) >= 1
        assert ready == 503
        counts = tally(outcomes)
        MATRIX[f"gateway SIGTERM with {STREAMS} open requests"] = counts
        assert not VIOLATIONS & set(counts)
        assert counts == {"ok": STREAMS}, counts
        assert process.wait(timeout=20) == 0, "the gateway exits by itself once drained"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert all(e.app.counters.active == 0 for e in engines)
