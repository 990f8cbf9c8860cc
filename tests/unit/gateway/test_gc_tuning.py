"""The collector of a serving process (`gateway.base.gc_tuning`): frozen after start-up with a larger young
threshold, set by the runner once the app's lifespan has started and only then."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

import gateway.uvicorn_runner as runner
from gateway.base.gc_tuning import YOUNG_THRESHOLD, tune_collector


@pytest.fixture
def restored_collector() -> Iterator[None]:
    """The test process's collector as it was (the test freezes and re-thresholds it)."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class Survivor:
    """A container object alive across `tune_collector`."""


def test_what_start_up_built_is_frozen_and_the_young_threshold_is_raised(restored_collector: None) -> None:
    older = gc.get_threshold()[1:]
    survivor = Survivor()
    tune_collector()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *older)
    assert all(obj is not survivor for generation in range(3) for obj in gc.get_objects(generation))
    later = Survivor()
    assert any(obj is later for obj in gc.get_objects(0))  # what comes later is collected as before


class LifespanApp:
    """An ASGI app that only answers the lifespan (and says whether its start-up is done)."""

    def __init__(self) -> None:
        self.started = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.started = True
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return


def test_the_runner_tunes_the_collector_after_the_lifespan_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    app = LifespanApp()
    seen: list[bool] = []
    monkeypatch.setattr(runner, "tune_collector", lambda: seen.append(app.started))
    config = uvicorn.Config(app, lifespan="on", log_level="warning")
    server = runner.DrainingServer(config, app)  # type: ignore[arg-type]

    async def start_and_stop() -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            config.load()
            server.lifespan = config.lifespan_class(config)
            await server.startup(sockets=[sock])
            await server.shutdown(sockets=[sock])

    asyncio.run(start_and_stop())
    assert seen == [True]
