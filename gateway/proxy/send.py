"""Send one try upstream and classify what came back; the upstream client does nothing else.

`UpstreamClient.send(ctx, attempt)` posts the request's upstream body to the attempt's replica and
returns the open response of a 2xx answer (the relay reads it), or raises:
- `UpstreamConnectError` when the replica cannot be reached,
- `StaleConnection` when the request hit a keep-alive connection the engine had already closed and no
  byte came back (the serve loop retries it once on a fresh connection, not held against the replica),
- `UpstreamTTFTTimeout` when a stream's headers do not arrive within the first-token deadline (which
  runs from the attempt's start),
- `UpstreamTotalTimeout` when a non-streamed answer's headers do not arrive within `nonstream_s` of the
  attempt's start (the engine sends nothing before it has finished: not retried); that bound, and the
  relay's for the body (`gateway.proxy.relay.relay_full`), are the only read timers of a non-streamed
  try: an idle timer of `nonstream_s` could never fire before them, and aiohttp re-arms one per
  packet received (a stream's reads are idle-timed, `idle_s`, by aiohttp's `sock_read`),
- `UpstreamStatusError` with the engine's status, body (up to 64 KiB) and Retry-After for an error.
Routing, claiming and retrying are not here: see `gateway.proxy.route`, `gateway.proxy.admit` and
the loop in `gateway.proxy.serving` (its policy in `gateway.proxy.retry_policy`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable
from typing import TypeVar

import aiohttp

from gateway.base.errors import (
    UpstreamConnectError,
    UpstreamStatusError,
    UpstreamTotalTimeout,
    UpstreamTTFTTimeout,
)
from gateway.proxy.attempt import Attempt
from gateway.proxy.context import RequestContext

MAX_ERROR_BODY_BYTES = 64 * 1024
TIMEOUT_CACHE_SIZE = 64
"""Distinct (connect, read) timeout pairs kept built (`client_timeout`): the pools' settings and the
few values the timer override headers bring."""

T = TypeVar("T")


def forget_frames(exc: BaseException) -> BaseException:
    """`exc` without its traceback and context, for every `except aiohttp.ClientError` of the serve path.

    aiohttp raises one shared `ClientConnectionError("Connection closed")` for every read of a response
    closed before its end (a try cut by a preemption notice, a leg cancelled): each raise leaves on that
    process-wide object a traceback whose frames hold the request that read it (its reply, client
    connection and buffers) until the next such read, in any request. Clearing what it caught keeps
    nothing of the request reachable from it."""
    exc.__traceback__ = None
    exc.__context__ = None
    return exc


@functools.lru_cache(maxsize=TIMEOUT_CACHE_SIZE)
def client_timeout(connect_s: float, sock_read_s: float | None) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts for one try: no total, `connect_s` to get a connection (and for the socket's
    connect), `sock_read_s` between reads (None: no read timer). Built once per pair (the object is
    frozen, so tries share it): building one costs more than the cache's look-up."""
    return aiohttp.ClientTimeout(total=None, connect=connect_s, sock_connect=connect_s, sock_read=sock_read_s)


async def within(delay_s: float, awaitable: Awaitable[T]) -> T:
    """`await awaitable`, cut after `delay_s` seconds: the same as awaiting it inside
    `async with asyncio.timeout(delay_s)` — the deadline cancels the current task (on the loop's next
    iteration when `delay_s` is not positive), and the cancellation it caused comes out as
    `TimeoutError`, while a cancellation someone else asked for (the client left) stays a
    `CancelledError` — with one timer handle and no context-manager object or coroutines of its own.
    Must run inside a task."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("within() must run inside a task")
    cancelling = task.cancelling()
    fired = False

    def on_deadline() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    when = loop.time() + delay_s
    handle = loop.call_soon(on_deadline) if when <= loop.time() else loop.call_at(when, on_deadline)
    try:
        return await awaitable
    except asyncio.CancelledError as exc:
        if fired:
            fired = False  # its cancellation is taken back here, not again below
            if task.uncancel() <= cancelling:
                raise TimeoutError from exc
        raise
    finally:
        handle.cancel()
        if fired:  # the deadline fired as the awaitable ended: its cancellation is not delivered
            task.uncancel()


class StaleConnection(Exception):
    """The engine closed a pooled keep-alive connection before answering (nothing was generated)."""


def _retry_after_s(response: aiohttp.ClientResponse) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class UpstreamClient:
    """Sends tries over the one shared proxy session (see the module docstring)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    async def send(self, ctx: RequestContext, attempt: Attempt) -> aiohttp.ClientResponse:
        """The open 2xx response of `attempt`'s replica, or the classified failure (module docstring)."""
        rid = attempt.slot.replica.replica_id
        timers = ctx.timers
        try:
            response = await self._post(ctx, attempt)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
            raise UpstreamConnectError(f"could not connect to replica {rid}", replica_id=rid) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            raise StaleConnection(rid) from None
        except TimeoutError:
            if not ctx.stream:  # the whole answer is late: the request's own length, never retried
                raise UpstreamTotalTimeout(
                    f"replica {rid} did not finish the response within {timers.nonstream_s} s", replica_id=rid
                ) from None
            raise UpstreamTTFTTimeout(
                f"no response from replica {rid} within the first-token deadline of {timers.ttft_s} s",
                replica_id=rid,
            ) from None
        if response.status >= 400:
            raise await self._status_error(response, rid)
        return response

    async def _post(self, ctx: RequestContext, attempt: Attempt) -> aiohttp.ClientResponse:
        timers = ctx.timers
        stream = ctx.stream
        request = self._session.request(
            ctx.parsed.method,
            attempt.slot.replica.url + ctx.parsed.upstream_path,
            data=ctx.upstream_body or None,
            headers=ctx.record.upstream_headers(ctx.upstream_headers),  # + the try's traceparent, if traced
            timeout=client_timeout(timers.connect_s, timers.idle_s if stream else None),
        )
        deadline_s = timers.ttft_s if stream else timers.nonstream_s
        return await within(deadline_s - attempt.elapsed_s(), request)

    async def _status_error(self, response: aiohttp.ClientResponse, replica_id: str) -> UpstreamStatusError:
        try:
            body = await response.content.read(MAX_ERROR_BODY_BYTES)
        except (aiohttp.ClientError, TimeoutError):
            body = b""
        finally:
            response.close()
        return UpstreamStatusError(
            f"replica {replica_id} answered {response.status}",
            status=response.status,
            body=body,
            content_type=response.headers.get("content-type"),
            replica_id=replica_id,
            retry_after_s=_retry_after_s(response),
        )
