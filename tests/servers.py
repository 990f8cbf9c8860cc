"""Real servers for integration tests: uvicorn on an ephemeral 127.0.0.1 port, each in its own thread
with its own event loop (so the sync OpenAI client can be used from the test thread)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import uvicorn

from bench import listen_ports
from gateway.api.connection_limit import ConnectionGuard
from gateway.app import GatewayApp, create_app
from gateway.config.settings import parse_settings
from gateway.uvicorn_runner import uvicorn_config
from mock_engine.core import DEFAULT_MAX_LORAS
from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.served_models import LoraModule
from mock_engine.server import MockEngineApp, MockEngineConfig

START_TIMEOUT_S = 10.0


class ServerThread:
    """`app` under uvicorn in a thread of its own, on asyncio's event loop or, with `uvloop=True`, on
    uvloop's (the loop `serve` runs in production)."""

    def __init__(self, app: Any, name: str, *, uvloop: bool = False) -> None:
        self.app = app
        self.name = name
        # IPPROTO_TCP: asyncio turns Nagle off only on sockets of that protocol (else each response
        # waits ~40 ms for a delayed ACK)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app, lifespan="on", log_level="warning", access_log=False, timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._uvloop = uvloop
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        factory = None
        if self._uvloop:
            import uvloop

            factory = uvloop.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(self._main())

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve(sockets=[self._sock])

    def call(self, coroutine: Any, timeout_s: float = 30.0) -> Any:
        """Run `coroutine` on the server's own event loop and wait for its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Graceful: uvicorn lets the responses in flight finish before the server stops."""
        self.server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()

    def kill(self) -> None:
        """Abrupt, like a crashed process: open connections are dropped mid-response."""
        assert self.loop is not None
        self.server.force_exit = True
        self.server.should_exit = True
        self.loop.call_soon_threadsafe(_abort_transports, self.server)
        self._thread.join(timeout=15)
        self._sock.close()


class GuardedGateway(ServerThread):
    """A gateway under the runner's uvicorn config (`gateway.uvicorn_runner.uvicorn_config`: the guarded
    protocol, as `serve` runs it)."""

    def __init__(
        self, raw_settings: dict[str, Any], file_limit: int | None = None, *, uvloop: bool = False
    ) -> None:
        settings = parse_settings(raw_settings)
        app: GatewayApp = create_app(settings)
        super().__init__(app, "guarded-gateway", uvloop=uvloop)
        guard = ConnectionGuard.from_settings(settings.server, app.state.metrics, file_limit)
        self.guard = guard
        self.server = uvicorn.Server(uvicorn_config(app, settings, "warning", guard))

    def metric(self, name: str, **labels: str) -> float:
        value = self.app.state.metrics.registry.get_sample_value(f"llm_gateway_{name}", labels)
        return 0.0 if value is None else float(value)

    def inflight(self) -> int:
        return sum(r.inflight_requests for r in self.app.state.registry.all_replicas())


def _abort_transports(server: uvicorn.Server) -> None:
    for connection in list(server.server_state.connections):
        transport = getattr(connection, "transport", None)
        if transport is not None:
            transport.abort()


def start_mock_engine(
    model: str = "test-model",
    first_token_delay_ms: float = 5.0,
    token_delay_ms: float = 1.0,
    faults: FaultSettings | None = None,
    default_max_tokens: int = 16,
    *,
    lora_modules: Iterable[str] = (),
    max_loras: int = DEFAULT_MAX_LORAS,
    allow_runtime_lora: bool = False,
    model_aliases: Iterable[str] = (),
    check_model: bool | None = None,
) -> ServerThread:
    """A fixed-delay mock engine serving `model`. LoRA (docs/MOCK_ENGINE.md, "Models and LoRA adapters"):
    `lora_modules` as `--lora-modules` reads them ("name" or "name=path"), `max_loras` adapters in the
    running batch, `allow_runtime_lora` for /v1/load_lora_adapter and /v1/unload_lora_adapter,
    `model_aliases` more base-model names; `check_model` (default: on with any of those) answers 404 for
    a model not served."""
    core = FixedDelayCore(first_token_delay_ms / 1000.0, token_delay_ms / 1000.0)
    config = MockEngineConfig(
        model=model,
        default_max_tokens=default_max_tokens,
        lora_modules=tuple(LoraModule.parse(text) for text in lora_modules),
        max_loras=max_loras,
        allow_runtime_lora=allow_runtime_lora,
        model_aliases=tuple(model_aliases),
        check_model=check_model,
    )
    app = MockEngineApp(config, core, faults or FaultSettings())
    return ServerThread(app, f"mock-engine-{model}").start()


def gateway_settings(pools: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": 0, "drain_timeout_s": 2},
        "pools": pools,
        "seed": 7,
        **extra,
    }


def start_gateway(raw_settings: dict[str, Any]) -> ServerThread:
    app: GatewayApp = create_app(parse_settings(raw_settings))
    return ServerThread(app, "gateway").start()


def free_port() -> int:
    """A port with nothing listening: connections to it are refused until a server binds it. Chosen
    below the ephemeral range (`bench.listen_ports`), so a subprocess started later still finds it free."""
    return listen_ports.free_port()


def wait_until(predicate: Callable[[], bool], timeout_s: float = 2.0, poll_s: float = 0.01) -> bool:
    """Poll `predicate` until it holds or `timeout_s` passes; returns its last value (for asserts)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()
