"""Relay an open upstream response to the client.

Streams: events are forwarded as soon as a raw upstream chunk completes them (one ASGI send per upstream
chunk, bytes unchanged). Response headers are held until the first content event (or the end of the
stream), so a failure before it is still a clean error response; the empty role chunk engines send at
once waits with them. Timers: until the first content event the first-token deadline runs (it started
when the request was sent upstream); after it, the idle timeout is the upstream read timeout, and the
optional total deadline bounds the whole stream. A stream that ends without `[DONE]` is a truncation and
ends with a terminal error event, never silently.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from gateway.errors import (
    UpstreamIdleTimeout,
    UpstreamProtocolError,
    UpstreamTotalTimeout,
    UpstreamTTFTTimeout,
)
from gateway.proxy.attempt import Attempt
from gateway.proxy.context import RequestContext
from gateway.proxy.reply import Reply
from gateway.proxy.sse import SSESplitter, inspect_event

SSE_CONTENT_TYPE = "text/event-stream"


def _encode_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def relay(ctx: RequestContext, reply: Reply, attempt: Attempt) -> None:
    """Relay `attempt`'s open response: as a stream when the client asked for one and the replica
    answers SSE, else as one whole response."""
    assert attempt.response is not None
    is_sse = attempt.response.headers.get("content-type", "").startswith(SSE_CONTENT_TYPE)
    if ctx.stream and is_sse:
        await StreamRelay(ctx, reply, attempt).run()
    else:
        await relay_full(reply, attempt, ctx.timers.nonstream_s)


async def _start(reply: Reply, status: int, content_type: str, extra: list[tuple[str, str]]) -> None:
    headers = reply.response_headers(content_type) + extra
    await reply.send({"type": "http.response.start", "status": status, "headers": _encode_headers(headers)})
    reply.started = True


async def finish_body(reply: Reply, body: bytes = b"") -> None:
    """Send the last body message; the disconnect watcher is disarmed first (see `DisconnectWatcher`)."""
    if reply.watcher is not None:
        reply.watcher.disarm()
    await reply.send({"type": "http.response.body", "body": body, "more_body": False})


async def relay_full(reply: Reply, attempt: Attempt, nonstream_s: float) -> None:
    """Read the whole upstream body, account usage, send it as one response."""
    response = attempt.response
    assert response is not None
    try:
        async with asyncio.timeout(nonstream_s):
            body = await response.read()
    except TimeoutError:
        raise UpstreamTotalTimeout(
            f"the replica did not finish the response within {nonstream_s} s"
        ) from None
    except aiohttp.ClientError as exc:
        raise UpstreamProtocolError(f"the replica failed while sending the response: {exc!r}") from None
    if b'"usage"' in body:
        try:
            data = orjson.loads(body)
            usage = data.get("usage") if isinstance(data, dict) else None
            reply.usage = usage if isinstance(usage, dict) else None
        except orjson.JSONDecodeError:
            pass
    reply.mark_first_output()  # the whole body: the client's first output
    content_type = response.headers.get("content-type", "application/json")
    extra = [("content-length", str(len(body)))]
    await _start(reply, response.status, content_type, extra)
    await finish_body(reply, body)


class StreamRelay:
    """Pumps one SSE stream (module docstring)."""

    def __init__(self, ctx: RequestContext, reply: Reply, attempt: Attempt) -> None:
        self._reply = reply
        self._attempt = attempt
        self._ttft_s = ctx.timers.ttft_s
        self._total_s = ctx.timers.total_s
        self._strip_usage = not ctx.parsed.client_wants_usage
        self._held: list[bytes] = []
        self._saw_done = False

    async def run(self) -> None:
        response = self._attempt.response
        assert response is not None
        reply = self._reply
        loop = asyncio.get_running_loop()
        now = loop.time()
        started = now - self._attempt.elapsed_s()
        request_started = now - reply.elapsed_s()
        total_deadline = None if self._total_s is None else request_started + self._total_s
        first_deadline = started + self._ttft_s
        if total_deadline is not None:
            first_deadline = min(first_deadline, total_deadline)
        splitter = SSESplitter()
        try:
            async with asyncio.timeout_at(first_deadline) as timer:
                async for chunk in response.content.iter_any():
                    out = self._filter(splitter.feed(chunk))
                    if not reply.started:
                        if reply.first_output_s is None:
                            continue
                        timer.reschedule(total_deadline)
                        out = b"".join(self._held) + out
                        await _start(reply, 200, SSE_CONTENT_TYPE, [("cache-control", "no-cache")])
                    if out:
                        await reply.send({"type": "http.response.body", "body": out, "more_body": True})
        except TimeoutError:
            if not timer.expired():
                raise UpstreamIdleTimeout("the replica sent nothing within the idle timeout") from None
            if reply.first_output_s is None:
                raise UpstreamTTFTTimeout(f"no first token within the deadline of {self._ttft_s} s") from None
            raise UpstreamTotalTimeout(
                f"the stream exceeded its total deadline of {self._total_s} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(f"the replica broke off the stream: {exc!r}") from None
        await self._end(splitter.remainder())

    def _filter(self, events: list[bytes]) -> bytes:
        kept: list[bytes] = []
        reply = self._reply
        for event in events:
            info = inspect_event(event, need_content=reply.first_output_s is None)
            if info.usage is not None:
                reply.usage = info.usage
            if info.is_done:
                self._saw_done = True
            if info.usage_only and self._strip_usage:
                continue
            if info.has_content or info.error or info.is_done:
                reply.mark_first_output()
            if reply.started:
                kept.append(event)
            else:
                self._held.append(event)
        return b"".join(kept)

    async def _end(self, remainder: bytes) -> None:
        reply = self._reply
        if not self._saw_done and not reply.started:
            raise UpstreamProtocolError("the replica ended the stream before any token or [DONE]")
        if not reply.started:
            await _start(reply, 200, SSE_CONTENT_TYPE, [("cache-control", "no-cache")])
            held = b"".join(self._held)
            if held:
                await reply.send({"type": "http.response.body", "body": held, "more_body": True})
        if not self._saw_done:
            raise UpstreamProtocolError("the replica ended the stream before [DONE]")
        await finish_body(reply, remainder)
