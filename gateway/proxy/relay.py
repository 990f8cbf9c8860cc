"""Relay an open upstream response to the client.

Streams: events are forwarded as soon as a raw upstream chunk completes them (one ASGI send per upstream
chunk, bytes unchanged). Response headers are held until the first content event (or the end of the
stream), so a failure before it is still a clean error response; the empty role chunk engines send at
once waits with them. Timers: until the first content event the first-token deadline runs (it started
when the request was sent upstream); after it, the idle timeout is the upstream read timeout, and the
optional total deadline bounds the whole stream. A stream that ends without `[DONE]` is a truncation and
ends with a terminal error event, never silently (the Anthropic and Responses streams end with their own
terminal events, `gateway.proxy.sse.inspect_named_event`) — unless the pool continues broken streams
(`gateway.proxy.continuation`): then one `StreamRelay` serves the request's tries, keeps what the client
received, and relays a continuation through a `Splice`; each try has its own first-token deadline.
"""

from __future__ import annotations

import asyncio
import re

import aiohttp
import orjson

from gateway.api.request_parsing import Endpoint
from gateway.base.errors import (
    UpstreamIdleTimeout,
    UpstreamProtocolError,
    UpstreamTotalTimeout,
    UpstreamTTFTTimeout,
)
from gateway.base.surface import ApiSurface
from gateway.observability.request_record import NO_RECORD, RequestRecord
from gateway.proxy.attempt import Attempt
from gateway.proxy.context import RequestContext
from gateway.proxy.continuation import Splice, StreamTranscript
from gateway.proxy.reply import Reply
from gateway.proxy.send import forget_frames, within
from gateway.proxy.sse import SSESplitter, inspect_event, inspect_named_event, merged_usage, normalized_usage

SSE_CONTENT_TYPE = "text/event-stream"
_FINISH_REASON = re.compile(rb'"finish_reason"\s*:\s*"([A-Za-z_]{1,32})"')
"""A choice's finish reason in an engine's JSON (a quote inside generated text is escaped, `\\"`, and
never matches); read only when the request is traced (`RequestRecord.collects_finish_reasons`)."""


def _finish_reasons(data: bytes, record: RequestRecord) -> None:
    for match in _FINISH_REASON.finditer(data):
        record.finish_reason(match.group(1).decode())


def _encode_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def relay(ctx: RequestContext, reply: Reply, attempt: Attempt, stream: StreamRelay) -> None:
    """Relay `attempt`'s open response: through `stream` when the client asked for a stream and the
    replica answers SSE, else as one whole response."""
    assert attempt.response is not None
    is_sse = attempt.response.headers.get("content-type", "").startswith(SSE_CONTENT_TYPE)
    if ctx.stream and is_sse:
        await stream.run(attempt)
    else:
        await relay_full(
            reply,
            attempt,
            ctx.timers.nonstream_s - attempt.elapsed_s(),
            ctx.record,
            response_ids=ctx.parsed.endpoint is Endpoint.RESPONSES,
        )


async def _start(reply: Reply, status: int, content_type: str, extra: list[tuple[str, str]]) -> None:
    headers = reply.response_headers(content_type) + extra
    await reply.send({"type": "http.response.start", "status": status, "headers": _encode_headers(headers)})
    reply.started = True
    reply.status = status


async def finish_body(reply: Reply, body: bytes = b"") -> None:
    """Send the last body message, after the reply's `before_end` hook; the disconnect watcher is disarmed
    first (see `DisconnectWatcher`)."""
    await reply.run_before_end()
    if reply.watcher is not None:
        reply.watcher.disarm()
    await reply.send({"type": "http.response.body", "body": body, "more_body": False})


async def relay_full(
    reply: Reply,
    attempt: Attempt,
    nonstream_s: float,
    record: RequestRecord = NO_RECORD,
    *,
    response_ids: bool = False,
) -> None:
    """Read the whole upstream body within `nonstream_s` (what is left of the attempt's bound), account
    usage, send it as one response. `response_ids`: a Responses API answer, whose `id` (a `response`
    object's) is kept in `reply.response_id` for state affinity."""
    response = attempt.response
    assert response is not None
    try:
        body = await within(nonstream_s, response.read())
    except TimeoutError:
        raise UpstreamTotalTimeout(
            "the replica did not finish the response within its bound (timeouts.nonstream_s)"
        ) from None
    except aiohttp.ClientError as exc:
        failed = f"the replica failed while sending the response: {forget_frames(exc)!r}"
        raise UpstreamProtocolError(failed) from None
    if b'"usage"' in body or response_ids:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            reply.usage = normalized_usage(data.get("usage"))
            response_id = data.get("id")
            if response_ids and data.get("object") == "response" and isinstance(response_id, str):
                reply.response_id = response_id
    if record.collects_finish_reasons:
        _finish_reasons(body, record)
    reply.mark_first_output()  # the whole body: the client's first output
    record.first_token(reply.first_output_s)
    content_type = response.headers.get("content-type", "application/json")
    extra = [("content-length", str(len(body)))]
    await _start(reply, response.status, content_type, extra)
    await finish_body(reply, body)


class StreamRelay:
    """Pumps one request's SSE stream, over one try or, after a break, the tries that continue it
    (module docstring; `gateway.proxy.continuation`)."""

    def __init__(
        self, ctx: RequestContext, reply: Reply, *, transcript: StreamTranscript | None = None
    ) -> None:
        self._reply = reply
        self._record = ctx.record
        self._finish_reasons = ctx.record.collects_finish_reasons
        self._ttft_s = ctx.timers.ttft_s
        self._total_s = ctx.timers.total_s
        self._strip_usage = not ctx.parsed.client_wants_usage
        self._surface = ctx.parsed.endpoint.surface
        self.transcript = transcript
        """What the client has received, kept when the pool continues broken streams (else None)."""
        self._splice: Splice | None = None
        self._held: list[bytes] = []
        self._saw_done = False
        self._got_first = False

    def continue_with(self, splice: Splice) -> None:
        """The next `run` relays a continuation: its events are rewritten by `splice`."""
        self._splice = splice

    async def run(self, attempt: Attempt) -> None:
        """Relay `attempt`'s open response until `[DONE]`, or raise the classified failure."""
        response = attempt.response
        assert response is not None
        reply = self._reply
        self._saw_done = self._got_first = False
        if not reply.started:
            self._held = []
        loop = asyncio.get_running_loop()
        now = loop.time()
        started = now - attempt.elapsed_s()
        request_started = now - reply.elapsed_s()
        total_deadline = None if self._total_s is None else request_started + self._total_s
        first_deadline = started + self._ttft_s
        if total_deadline is not None:
            first_deadline = min(first_deadline, total_deadline)
        splitter = SSESplitter()
        cost = attempt.slot.replica.cost
        try:
            async with asyncio.timeout_at(first_deadline) as timer:
                async for chunk in response.content.iter_any():
                    first_before = self._got_first
                    out = self._filter(splitter.feed(chunk))
                    if self._got_first and not first_before:
                        timer.reschedule(total_deadline)
                        attempt.slot.first_token(learn=self._splice is None)
                        self._record.first_token(reply.first_output_s)
                    if self._got_first:  # tokens come at the engine's step ends: the step's phase
                        cost.token_relayed()
                    if not reply.started:
                        if not self._got_first:
                            continue
                        out = b"".join(self._held) + out
                        await _start(reply, 200, SSE_CONTENT_TYPE, [("cache-control", "no-cache")])
                    if out:
                        await reply.send({"type": "http.response.body", "body": out, "more_body": True})
                        if self.transcript is not None:
                            self.transcript.record(out)
        except TimeoutError:
            if not timer.expired():
                raise UpstreamIdleTimeout("the replica sent nothing within the idle timeout") from None
            if not self._got_first:
                raise UpstreamTTFTTimeout(f"no first token within the deadline of {self._ttft_s} s") from None
            raise UpstreamTotalTimeout(
                f"the stream exceeded its total deadline of {self._total_s} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(f"the replica broke off the stream: {forget_frames(exc)!r}") from None
        await self._end(splitter.remainder())

    def _filter(self, events: list[bytes]) -> bytes:
        kept: list[bytes] = []
        reply = self._reply
        splice = self._splice
        for raw in events:
            event = raw if splice is None else splice.rewrite(raw)
            if event is None:
                continue
            if self._surface is ApiSurface.OPENAI:
                info = inspect_event(event, need_content=not self._got_first)
            else:
                info = inspect_named_event(event, not self._got_first, self._surface)
                if info.response_id is not None:
                    reply.response_id = info.response_id
            if self._finish_reasons and b'"finish_reason"' in event:
                _finish_reasons(event, self._record)
            if info.usage is not None:
                reply.usage = info.usage if info.usage_only else merged_usage(reply.usage, info.usage)
            if info.is_done:
                self._saw_done = True
            if info.usage_only and self._strip_usage:
                continue
            if info.has_content or info.error or info.is_done:
                self._got_first = True
                reply.mark_first_output()
            if reply.started:
                kept.append(event)
            else:
                self._held.append(event)
        return b"".join(kept)

    async def _end(self, remainder: bytes) -> None:
        reply = self._reply
        if not self._saw_done and not reply.started:
            raise UpstreamProtocolError("the replica ended the stream before any token or its end event")
        if not reply.started:
            await _start(reply, 200, SSE_CONTENT_TYPE, [("cache-control", "no-cache")])
            held = b"".join(self._held)
            if held:
                await reply.send({"type": "http.response.body", "body": held, "more_body": True})
        if not self._saw_done:
            raise UpstreamProtocolError("the replica ended the stream before its end event ([DONE])")
        await finish_body(reply, remainder)
