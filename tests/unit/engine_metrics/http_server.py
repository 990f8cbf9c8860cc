"""A tiny HTTP/1.1 server on 127.0.0.1 and small doubles for the scraper tests."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field

from gateway.upstream.engine_metrics.sample import EngineSample
from mock_engine.core import EngineStats
from mock_engine.metrics_text import render_metrics
from router.types import EngineLoad

MODEL = "test-model"
STATS = EngineStats(3, 80, 0.5, 1000, 250, 900, 5000, 0)


class MetricsServer:
    """A tiny HTTP/1.1 server: answers every request with the current `status` / `body` after `delay_s`,
    or closes the connection without an answer when `hang_up` is set."""

    def __init__(self) -> None:
        self.status = 200
        self.body = render_metrics(MODEL, STATS)
        self.delay_s = 0.0
        self.hang_up = False
        self.paths: list[str] = []
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> MetricsServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._handle(reader, writer))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.paths.append(head.split(b" ")[1].decode())
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if not self.hang_up:
                writer.write(
                    f"HTTP/1.1 {self.status} X\r\ncontent-type: text/plain; version=0.0.4\r\n"
                    f"content-length: {len(self.body)}\r\nconnection: close\r\n\r\n".encode()
                    + self.body
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@dataclass
class Target:
    replica_id: str
    url: str
    engine: EngineLoad | None = None
    sampled: list[EngineSample | None] = field(default_factory=list)
    learned_cap: int | None = None
    grows: bool = False
    """What `engine_sampled` answers: the sample let it take more requests."""

    def engine_sampled(self, sample: EngineSample | None) -> bool:
        self.sampled.append(sample)
        return self.grows


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
