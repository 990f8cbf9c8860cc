"""The benchmark client: one shared `httpx.AsyncClient`, one `Sample` per request.

Streams are read as raw bytes and split into SSE events by hand (no per-line decoding); each `data:`
payload goes to `bench.stream_events`, which takes the time to first token at the first event *with
content* (`core.first_token`: the gateway's definition) and the output tokens from the usage event.

Answers other than 200 record `x-gateway-reject-reason`, `Retry-After` and their latency. With
`retry_after_retries > 0` the client honours `Retry-After` (sleeps, then resends, at most that many
times); the sample's latency then runs from the first attempt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import httpx
import orjson

from bench.sample import Sample
from bench.stream_events import StreamFound, on_event, stream_sample
from bench.workload import RequestSpec


@dataclass(frozen=True, slots=True)
class ClientOptions:
    model: str
    stream: bool = True
    timeout_s: float = 300.0
    api_key: str | None = None
    retry_after_retries: int = 0
    max_connections: int = 4096
    extra_headers: dict[str, str] = field(default_factory=dict)
    keep_alive: bool = False  # the raw client only (httpx always pools connections)


def sample_base(
    spec: RequestSpec, index: int, scheduled_s: float, started: float, run_start: float
) -> dict[str, Any]:
    """The fields every sample of this request carries, whatever the answer."""
    return {
        "index": index,
        "scheduled_s": scheduled_s,
        "sent_s": started - run_start,
        "priority": spec.priority,
        "group": spec.group,
        "max_tokens": spec.max_tokens,
        "poisoned": spec.poisoned,
    }


async def honour_retry_after(attempt: Callable[[], Awaitable[Sample]], retries: int) -> Sample:
    """Run `attempt`; while it is a 429/503 with Retry-After and retries are left, sleep that long and
    try again. The sample of the last attempt is returned with the number of attempts."""
    sample = await attempt()
    attempts = 1
    while sample.retry_after_s is not None and sample.status in (429, 503) and attempts <= retries:
        await asyncio.sleep(sample.retry_after_s)
        attempts += 1
        sample = await attempt()
    return replace(sample, attempts=attempts) if attempts > 1 else sample


def parse_retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return 1.0  # an HTTP-date: present, honoured as one second


class Client(Protocol):
    """What the runner needs of a client (`BenchClient`, or `rawsse.RawSseClient` for `--client raw`)."""

    async def send(
        self, base_url: str, spec: RequestSpec, index: int, scheduled_s: float, run_start: float
    ) -> Sample: ...

    async def aclose(self) -> None: ...


class BenchClient:
    def __init__(self, options: ClientOptions, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.options = options
        headers = {"content-type": "application/json", **options.extra_headers}
        if options.api_key:
            headers["authorization"] = f"Bearer {options.api_key}"
        limits = httpx.Limits(
            max_connections=options.max_connections, max_keepalive_connections=options.max_connections
        )
        timeout = httpx.Timeout(options.timeout_s, connect=10.0)
        self._http = httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(
        self, base_url: str, spec: RequestSpec, index: int, scheduled_s: float, run_start: float
    ) -> Sample:
        """Send `spec` to `base_url` (honouring Retry-After when configured) and measure it."""
        started = time.perf_counter()
        base = sample_base(spec, index, scheduled_s, started, run_start)
        return await honour_retry_after(
            lambda: self._attempt(base_url, spec, base, started), self.options.retry_after_retries
        )

    async def _attempt(
        self, base_url: str, spec: RequestSpec, base: dict[str, Any], started: float
    ) -> Sample:
        """One HTTP exchange; latencies run from `started` (the first attempt)."""
        path = "/v1/chat/completions" if spec.chat else "/v1/completions"
        content = orjson.dumps(spec.body(self.options.model, self.options.stream))
        try:
            async with self._http.stream(
                "POST", base_url + path, content=content, headers=spec.headers()
            ) as response:
                meta = _response_meta(response)
                if response.status_code != 200:
                    await response.aread()
                    return Sample(
                        **base, status=response.status_code, ok=False, e2e_s=_since(started), **meta
                    )
                if self.options.stream:
                    found = await _read_stream(response, started)
                    return stream_sample(base, meta, found, _since(started))
                payload = orjson.loads(await response.aread())
                e2e = _since(started)
                usage = payload.get("usage") or {}
                return Sample(
                    **base,
                    status=200,
                    ok=True,
                    e2e_s=e2e,
                    ttft_s=e2e,
                    output_tokens=int(usage.get("completion_tokens") or 0),
                    prompt_tokens=usage.get("prompt_tokens"),
                    frames=1,
                    **meta,
                )
        except (httpx.HTTPError, orjson.JSONDecodeError) as exc:
            return Sample(**base, status=0, ok=False, e2e_s=_since(started), error=type(exc).__name__)


def _since(started: float) -> float:
    return time.perf_counter() - started


def _response_meta(response: httpx.Response) -> dict[str, Any]:
    return {
        "replica": response.headers.get("x-gateway-replica"),
        "route": response.headers.get("x-gateway-route"),
        "reject_reason": response.headers.get("x-gateway-reject-reason"),
        "retry_after_s": parse_retry_after(response.headers.get("retry-after")),
    }


async def _read_stream(response: httpx.Response, started: float) -> StreamFound:
    found = StreamFound()
    buffer = b""
    last: float | None = None  # arrival of the previous event batch, from the first content on
    async for chunk in response.aiter_raw():
        now = time.perf_counter()
        buffer += chunk
        if b"\n\n" not in buffer:
            continue
        *events, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            if event.startswith(b"data:"):
                on_event(found, event[5:].strip(), now - started)
        if found.ttft_s is not None:
            if last is not None:
                found.max_gap_s = max(found.max_gap_s, now - last)
            last = now
    return found
