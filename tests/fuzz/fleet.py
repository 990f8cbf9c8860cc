"""The fuzz suite's fleet: a real gateway in front of mock engines (`conftest.fleet` starts one per module).

Two pools: `MODEL` (two engines, the body forwarded as sent unless the gateway adds `include_usage`;
every endpoint) and `REWRITE` (one engine, `upstream_model` set, so every body is re-serialised; every
endpoint but `REWRITE_NOT_SERVED`, so those are its 404 `endpoint_not_served`). The engines answer at
once (no token delay) and have a context limit, so any `max_tokens` the gateway lets through is bounded.
`stored` holds one Responses-API response per pool, created through the gateway at the start, so
`previous_response_id` and the `/v1/responses/{id}` calls reach a replica that holds one.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from hypothesis import HealthCheck, settings

from gateway.api.request_parsing import Endpoint
from gateway.app import create_app
from gateway.config.settings import parse_settings
from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.server import MockEngineApp, MockEngineConfig
from tests.servers import ServerThread, gateway_settings

MODEL = "fuzz-model"
REWRITE = "fuzz-rewrite"
MAX_BODY_BYTES = 32 * 1024
ENGINE_CONTEXT_TOKENS = 512
REWRITE_NOT_SERVED = frozenset({"score", "classify"})
SERVED: dict[str, frozenset[str]] = {
    MODEL: frozenset(e.capability for e in Endpoint),
    REWRITE: frozenset(e.capability for e in Endpoint) - REWRITE_NOT_SERVED,
}
"""What each pool serves (capability names, `Endpoint.capability`)."""

FUZZ_SETTINGS = settings(
    max_examples=int(os.environ.get("LLM_GATEWAY_FUZZ_EXAMPLES", "200")),
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
"""The bounds of every property here: 200 examples, 2 s each at most (the whole fuzz group, schemathesis
included, ran in 55 s before the newer surfaces and 70 s with them, on 2 shared cores)."""


@dataclass
class Fleet:
    gateway: ServerThread
    engines: list[ServerThread]
    client: httpx.Client
    stored: dict[str, str]
    """Response id → the pool that holds it (one per pool, module docstring)."""

    @property
    def url(self) -> str:
        return self.gateway.url


class NoDelayServer(ServerThread):
    """`ServerThread` with Nagle off on its connections. Its listening socket is made with protocol 0,
    so asyncio (which sets TCP_NODELAY only when `proto == IPPROTO_TCP`) leaves Nagle on, and each answer
    written in two parts waits for the client's delayed ACK: about 40 ms a request instead of 0.5 ms.
    Accepted sockets inherit TCP_NODELAY from the listening socket (Linux)."""

    def __init__(self, app: Any, name: str) -> None:
        super().__init__(app, name)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def start_engine(name: str) -> ServerThread:
    config = MockEngineConfig(model=name, default_max_tokens=4, max_context_tokens=ENGINE_CONTEXT_TOKENS)
    app = MockEngineApp(config, FixedDelayCore(0.0, 0.0), FaultSettings())
    return NoDelayServer(app, f"fuzz-engine-{name}").start()


def start_fleet() -> Iterator[Fleet]:
    """Start the fleet; stop it when the generator is closed."""
    engines = [start_engine(MODEL), start_engine(MODEL), start_engine(REWRITE)]
    timeouts = {"ttft_s": 10.0, "nonstream_s": 10.0}
    pools = [
        {"model": MODEL, "replicas": {"static": [e.url for e in engines[:2]]}, "timeouts": timeouts},
        {
            "model": REWRITE,
            "upstream_model": MODEL,
            "replicas": {"static": [engines[2].url]},
            "timeouts": timeouts,
            "endpoints": sorted(SERVED[REWRITE]),
        },
    ]
    raw = gateway_settings(pools)
    raw["server"] = {**raw["server"], "max_body_bytes": MAX_BODY_BYTES}
    gateway = NoDelayServer(create_app(parse_settings(raw)), "fuzz-gateway").start()
    client = httpx.Client(base_url=gateway.url, timeout=httpx.Timeout(15.0))
    try:
        yield Fleet(gateway, engines, client, {create_response(client, name): name for name in SERVED})
    finally:
        client.close()
        gateway.stop()
        for engine in engines:
            engine.stop()


def create_response(client: httpx.Client, model: str) -> str:
    """A stored Responses-API response of `model`'s pool, created through the gateway: its id."""
    response = client.post(
        Endpoint.RESPONSES.value, json={"model": model, "input": "hi", "max_output_tokens": 2}
    )
    assert response.status_code == 200, response.text
    response_id: str = response.json()["id"]
    return response_id
