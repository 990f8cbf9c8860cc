"""Mock engines served by uvicorn on ephemeral 127.0.0.1 ports, and an SSE reader for their streams."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.server import MockEngineApp, MockEngineConfig
from tests.servers import ServerThread

MODEL = "fault-model"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TIMEOUT = httpx.Timeout(5.0)


@pytest.fixture
def engine() -> Iterator[Callable[..., ServerThread]]:
    """`engine(faults=..., seed=..., token_delay_ms=..., max_tokens=...)` starts a mock engine."""
    started: list[ServerThread] = []

    def factory(
        faults: FaultSettings | None = None,
        seed: int = 0,
        first_token_delay_ms: float = 1.0,
        token_delay_ms: float = 1.0,
        max_tokens: int = 8,
    ) -> ServerThread:
        app = MockEngineApp(
            MockEngineConfig(model=MODEL, default_max_tokens=max_tokens),
            FixedDelayCore(first_token_delay_ms / 1000.0, token_delay_ms / 1000.0),
            faults or FaultSettings(),
            seed=seed,
        )
        server = ServerThread(app, "mock-engine-faults").start()
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


def chat_body(stream: bool = True, max_tokens: int | None = None, prompt: str = "hello") -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "stream": stream,
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


@dataclass
class StreamRead:
    """What a streaming client saw: each SSE event (decoded) with its arrival time, and how it ended."""

    status: int
    started_at: float
    events: list[tuple[float, Any]] = field(default_factory=list)
    error: Exception | None = None

    @property
    def tokens(self) -> list[str]:
        out = []
        for _, event in self.events:
            if event == "[DONE]" or not event.get("choices"):
                continue
            delta = event["choices"][0].get("delta", {})
            if delta.get("content") and event["choices"][0]["finish_reason"] is None:
                out.append(delta["content"])
        return out

    @property
    def token_times(self) -> list[float]:
        return [t for t, e in self.events if e != "[DONE]" and _is_token(e)]

    @property
    def done(self) -> bool:
        return any(e == "[DONE]" for _, e in self.events)


def _is_token(event: Any) -> bool:
    choices = event.get("choices") or []
    return bool(choices and choices[0].get("delta", {}).get("content") and not choices[0]["finish_reason"])


def read_stream(
    client: httpx.Client, url: str, body: dict[str, Any], stop_after_tokens: int | None = None
) -> StreamRead:
    """Stream a chat completion, recording events; transport errors end the read and are kept."""
    t0 = time.monotonic()
    with client.stream("POST", url + CHAT, json=body) as response:
        read = StreamRead(response.status_code, t0)
        try:
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: ") :]
                event = "[DONE]" if payload == "[DONE]" else orjson.loads(payload)
                read.events.append((time.monotonic() - t0, event))
                if stop_after_tokens is not None and len(read.tokens) >= stop_after_tokens:
                    break
        except httpx.TransportError as exc:
            read.error = exc
    return read


def stats(url: str) -> dict[str, int]:
    result: dict[str, int] = httpx.get(url + "/mock/stats", timeout=TIMEOUT).json()
    return result


def wait_until(predicate: Callable[[], bool], timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
