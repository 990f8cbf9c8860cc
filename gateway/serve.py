"""Run the gateway under uvicorn (uvloop + httptools when installed), with a graceful shutdown."""

from __future__ import annotations

import uvicorn

from gateway.app import create_app
from gateway.settings import Settings


def uvicorn_config(settings: Settings, log_level: str = "info") -> uvicorn.Config:
    """Server options: Nagle is off on accepted sockets (asyncio sets TCP_NODELAY); no access log on
    the hot path; graceful shutdown waits for the app's drain (`server.drain_timeout_s`) plus slack."""
    return uvicorn.Config(
        create_app(settings),
        host=settings.server.host,
        port=settings.server.port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(settings.server.drain_timeout_s) + 5,
        timeout_keep_alive=75,
    )


def serve(settings: Settings, log_level: str = "info") -> None:
    uvicorn.Server(uvicorn_config(settings, log_level)).run()
