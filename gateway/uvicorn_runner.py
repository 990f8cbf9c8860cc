"""Run the gateway under uvicorn (uvloop + httptools when installed), with a graceful drain on SIGTERM.

First SIGTERM/SIGINT: `GatewayApp.drain()` runs while the listener stays open — readiness fails,
new requests get 503 `draining` with Retry-After (clients and load balancers move on), in-flight
requests get `server.drain_timeout_s` to finish, the rest end with the terminal error — then uvicorn
stops. A second signal stops at once. Kubernetes: give the pod a preStop sleep of about
`readiness_propagation_s` and `terminationGracePeriodSeconds` > preStop + drain_timeout_s + a few s.
"""

from __future__ import annotations

import asyncio
from types import FrameType

import uvicorn

from gateway.app import GatewayApp, create_app
from gateway.settings import Settings


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains the app before the server stops."""

    def __init__(self, config: uvicorn.Config, app: GatewayApp) -> None:
        super().__init__(config)
        self._app = app
        self._drain_requested = False
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_requested:
            super().handle_exit(sig, frame)
            self.force_exit = True
            return
        self._drain_requested = True

    async def on_tick(self, counter: int) -> bool:
        if self._drain_requested and self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain_then_exit())
        return await super().on_tick(counter)

    async def _drain_then_exit(self) -> None:
        await self._app.drain()
        self.should_exit = True


def uvicorn_config(app: GatewayApp, settings: Settings, log_level: str = "info") -> uvicorn.Config:
    """Server options: Nagle is off on accepted sockets (asyncio sets TCP_NODELAY); no access log on
    the hot path; uvicorn's own graceful shutdown only has to close idle connections after our drain."""
    return uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=75,
        proxy_headers=False,
    )


def serve(settings: Settings, log_level: str = "info") -> None:
    app = create_app(settings)
    DrainingServer(uvicorn_config(app, settings, log_level), app).run()
