"""A lean HTTP/1.1 streaming client on bare asyncio streams (`--client raw`), the same `send` as
`BenchClient` for streamed requests.

Why: on a small machine the client shares cores with what it measures. httpx's connection pool does
bookkeeping that grows with the number of open connections, so with hundreds of concurrent streams the
client, not the gateway, sets the limit; this client costs about an order of magnitude less CPU per
stream (docs/bench-log/2026-12-05-rounds.md, "Gateway overhead").

It opens one connection per request (`connection: close`) or, with `keep_alive` (`--keep-alive`),
reuses idle ones as SDK clients do: a connection goes back to the pool only after a complete response
(the chunked body's last chunk read, or a non-200 body of known length drained) and not when the server
said `connection: close`; a reused connection that the server closed meanwhile (its keep-alive timeout)
is retried once on a fresh one, before any response byte was read. It sends one POST and reads the
chunked or plain body frame by frame and hands each `data:` payload to `bench.stream_events`, as
`BenchClient` does, so both record the same fields the same way: TTFT at the first frame with content
(`core.first_token`, the gateway's definition), output tokens from the usage event (else the content
frames), the largest gap between frames after the first token, `[DONE]` or not, a terminal error event,
and the response headers `x-gateway-replica`, `x-gateway-route`, `x-gateway-reject-reason`,
`Retry-After`. A refusal's latency is taken when its headers have arrived. No TLS or redirects: a
measuring instrument for plain-HTTP targets on 127.0.0.1 or a LAN.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

import orjson

from bench.client import ClientOptions, honour_retry_after, parse_retry_after, sample_base
from bench.sample import Sample
from bench.stream_events import StreamFound, on_event, stream_sample
from bench.workload import RequestSpec


def _request(url: str, spec: RequestSpec, options: ClientOptions) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    path = (parts.path.rstrip("/") or "") + ("/v1/chat/completions" if spec.chat else "/v1/completions")
    body = orjson.dumps(spec.body(options.model, stream=True))
    headers = {
        "host": parts.netloc,
        "content-type": "application/json",
        "content-length": str(len(body)),
        "connection": "keep-alive" if options.keep_alive else "close",
        **options.extra_headers,
        **spec.headers(),
    }
    if options.api_key:
        headers["authorization"] = f"Bearer {options.api_key}"
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return parts.hostname or "127.0.0.1", parts.port or 80, head.encode() + body


def _headers(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _finish_body(reader: asyncio.StreamReader, headers: dict[str, str], chunked: bool) -> bool:
    """Read what is left of a response body so the connection can carry the next request; True when
    the body ended cleanly (a chunked body's last chunk, or `content-length` bytes)."""
    if chunked:
        while await _next_piece(reader, chunked=True):
            pass
        return (await reader.readuntil(b"\r\n")) == b"\r\n"  # no trailers
    length = headers.get("content-length")
    if length is None:
        return False
    await reader.readexactly(int(length))
    return True


async def _next_piece(reader: asyncio.StreamReader, chunked: bool) -> bytes:
    """The next body bytes: one chunk of a chunked body, or whatever arrived of a plain one."""
    if not chunked:
        return await reader.read(65536)
    size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
    if size == 0:
        return b""
    return (await reader.readexactly(size + 2))[:-2]


async def _read_events(reader: asyncio.StreamReader, chunked: bool, started: float) -> StreamFound:
    found = StreamFound()
    buffer = b""
    last: float | None = None
    while not found.done:
        piece = await _next_piece(reader, chunked)
        if not piece:
            break
        now = time.perf_counter()
        buffer += piece
        while b"\n\n" in buffer and not found.done:
            event, buffer = buffer.split(b"\n\n", 1)
            at = event.find(b"data:")
            if at >= 0:
                on_event(found, event[at + 5 :].strip(), now - started)
        if found.ttft_s is not None:
            if last is not None:
                found.max_gap_s = max(found.max_gap_s, now - last)
            last = now
    return found


class RawSseClient:
    """Streams only (a non-streamed request still gets `stream: true`)."""

    def __init__(self, options: ClientOptions) -> None:
        self.options = options
        self._idle: dict[tuple[str, int], list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}

    async def aclose(self) -> None:
        for connections in self._idle.values():
            for _, writer in connections:
                writer.close()
        self._idle.clear()

    async def _connect(
        self, host: str, port: int, fresh_only: bool = False
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """An idle pooled connection (reused = True) or, also when `fresh_only`, a new one."""
        idle = [] if fresh_only else self._idle.get((host, port), [])
        while idle:
            reader, writer = idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection(host, port)
        return reader, writer, False

    def _release(
        self, host: str, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reusable: bool
    ) -> None:
        if reusable and self.options.keep_alive and not writer.is_closing():
            self._idle.setdefault((host, port), []).append((reader, writer))
        else:
            writer.close()

    async def send(
        self, base_url: str, spec: RequestSpec, index: int, scheduled_s: float, run_start: float
    ) -> Sample:
        started = time.perf_counter()
        base = sample_base(spec, index, scheduled_s, started, run_start)
        return await honour_retry_after(
            lambda: self._attempt(base_url, spec, base, started), self.options.retry_after_retries
        )

    async def _attempt(self, url: str, spec: RequestSpec, base: dict[str, Any], started: float) -> Sample:
        host, port, request = _request(url, spec, self.options)
        try:
            async with asyncio.timeout(self.options.timeout_s):
                return await self._exchange(host, port, request, base=base, started=started)
        except (
            OSError,
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ) as exc:
            return Sample(
                **base, status=0, ok=False, e2e_s=time.perf_counter() - started, error=type(exc).__name__
            )

    async def _exchange(
        self, host: str, port: int, request: bytes, *, base: dict[str, Any], started: float
    ) -> Sample:
        fresh_only = False
        while True:
            reader, writer, reused = await self._connect(host, port, fresh_only)
            reusable = False
            try:
                writer.write(request)
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError) as exc:
                    nothing_read = not isinstance(exc, asyncio.IncompleteReadError) or not exc.partial
                    if reused and nothing_read:
                        fresh_only = True  # closed by the server while idle: once more, on a new one
                        continue
                    raise
                status, headers = _headers(head)
                meta: dict[str, Any] = {
                    "replica": headers.get("x-gateway-replica"),
                    "route": headers.get("x-gateway-route"),
                    "reject_reason": headers.get("x-gateway-reject-reason"),
                    "retry_after_s": parse_retry_after(headers.get("retry-after")),
                }
                chunked = "chunked" in headers.get("transfer-encoding", "").lower()
                keep = self.options.keep_alive and headers.get("connection", "").lower() != "close"
                if status != 200:
                    e2e_s = time.perf_counter() - started
                    reusable = keep and await _finish_body(reader, headers, chunked)
                    return Sample(**base, status=status, ok=False, e2e_s=e2e_s, **meta)
                found = await _read_events(reader, chunked, started)
                reusable = keep and found.done and chunked and await _finish_body(reader, headers, chunked)
            finally:
                self._release(host, port, reader, writer, reusable)
            break
        return stream_sample(base, meta, found, time.perf_counter() - started)
