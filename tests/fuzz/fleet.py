"""The fuzz suite's fleet: a real gateway in front of mock engines (`conftest.fleet` starts one per module).

Two pools: `MODEL` (two engines, the body forwarded as sent unless the gateway adds `include_usage`) and
`REWRITE` (one engine, `upstream_model` set, so every body is re-serialised). The engines answer at once
(no token delay) and have a context limit, so any `max_tokens` the gateway lets through is bounded.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from hypothesis import HealthCheck, settings

from gateway.app import create_app
from gateway.settings import parse_settings
from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.server import MockEngineApp, MockEngineConfig
from tests.servers import ServerThread, gateway_settings

MODEL = "fuzz-model"
REWRITE = "fuzz-rewrite"
MAX_BODY_BYTES = 32 * 1024
ENGINE_CONTEXT_TOKENS = 512

FUZZ_SETTINGS = settings(
    max_examples=int(os.environ.get("LLM_GATEWAY_FUZZ_EXAMPLES", "200")),
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
"""The bounds of every property here: 200 examples, 2 s each at most (the suite runs in well under 60 s)."""


@dataclass
class Fleet:
    gateway: ServerThread
    engines: list[ServerThread]
    client: httpx.Client

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
        },
    ]
    raw = gateway_settings(pools)
    raw["server"] = {**raw["server"], "max_body_bytes": MAX_BODY_BYTES}
    gateway = NoDelayServer(create_app(parse_settings(raw)), "fuzz-gateway").start()
    client = httpx.Client(base_url=gateway.url, timeout=httpx.Timeout(15.0))
    try:
        yield Fleet(gateway, engines, client)
    finally:
        client.close()
        gateway.stop()
        for engine in engines:
            engine.stop()
