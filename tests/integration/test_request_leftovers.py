"""Nothing outlives its request (issue 30): after a mix of requests through a real gateway — streamed
and not, answered and refused, upstream errors, clients that leave mid-stream, streams whose try is cut
by a preemption notice — and once every client connection is closed, no object of those requests is
left in the gateway's process: no client-side or upstream-side per-request object, no uvicorn request
cycle or connection, no timer handle beyond what the idle gateway holds, no task; and every in-flight
count is back to zero.

Counted on the gateway's own event loop after `gc.collect()` (the gateway runs in a thread of the test
process, as `serve` runs it: the guarded protocol, the default 30 s write deadline), under asyncio's loop
and under uvloop's. Objects alive before the traffic (other tests' servers share the process) are left
out by identity. A leftover held by a timer would survive for that timer's delay, one held by a shared
object until that object lets go; the census allows only a few seconds, so either fails the test.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from aiohttp.helpers import _weakref_handle as weakref_handle
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from admission.ticket import Ticket
from gateway.api.asgi_io import ClientIO, DisconnectWatcher
from gateway.api.connection_guard import GuardedProtocol
from gateway.proxy.attempt import Attempt
from gateway.proxy.context import RequestContext
from gateway.proxy.reply import Reply
from mock_engine.faults import FaultSettings
from tests.integration.conftest import MODEL, pool
from tests.servers import GuardedGateway, ServerThread, gateway_settings, wait_until

POISON = "poison-7781"
"""A prompt marker the engine answers with a 500 (its poison-prompt fault)."""
EACH = 12
"""Requests of each kind."""
SETTLE_S = 5.0
"""How long the census may take to come out clean: much less than the write deadline (30 s)."""
PER_REQUEST = (ClientIO, DisconnectWatcher, Reply, RequestContext, Attempt, Ticket)


@pytest.fixture
def gateway(
    mock_engines: Callable[..., ServerThread], request: pytest.FixtureRequest
) -> Iterator[GuardedGateway]:
    faults = FaultSettings(poison_marker=POISON, poison_effect="error")
    engine = mock_engines(model=MODEL, first_token_delay_ms=1, token_delay_ms=1, faults=faults)
    raw = gateway_settings([pool([engine], retries={"max_attempts": 1})])
    server = GuardedGateway(raw, uvloop=request.param == "uvloop")
    server.start()
    yield server
    server.stop()


def _timer_loop_and_callback(handle: object) -> tuple[object, object] | None:
    """(loop, callback) of a timer handle of asyncio or uvloop still to run; (None, None) for one that
    ran or was cancelled (it holds nothing); None for anything else."""
    if isinstance(handle, asyncio.TimerHandle):
        pending = handle._scheduled and not handle.cancelled()  # type: ignore[attr-defined]
        return (handle._loop, handle._callback) if pending else (None, None)  # type: ignore[attr-defined]
    if type(handle).__module__ == "uvloop.loop" and type(handle).__name__ == "TimerHandle":
        referents = gc.get_referents(handle)  # uvloop keeps (callback, args, timer, loop, ...)
        pending = referents[0] is not None and not handle.cancelled()  # type: ignore[attr-defined]
        return (referents[3], referents[0]) if pending else (None, None)
    return None


def _callback_name(callback: object) -> str:
    owner = getattr(callback, "__self__", None)
    name = getattr(callback, "__qualname__", type(callback).__qualname__)
    return name if owner is None else f"{type(owner).__qualname__}.{getattr(callback, '__name__', name)}"


async def _census(port: int, app_timer: object) -> dict[str, Any]:
    """What the gateway's process holds now, seen from its event loop (so the loop is not mid-step);
    `port`: the gateway's (uvicorn's request cycles of the engines are theirs, not the gateway's);
    `app_timer`: the application's one write-deadline timer, armed by requests but holding none."""
    loop = asyncio.get_running_loop()
    gc.collect()
    kinds: collections.defaultdict[str, set[int]] = collections.defaultdict(set)
    timers: collections.Counter[str] = collections.Counter()
    for obj in gc.get_objects():
        if isinstance(obj, PER_REQUEST):
            kinds[type(obj).__qualname__].add(id(obj))
        elif isinstance(obj, GuardedProtocol):  # client connections (the engines' are uvicorn's own)
            kinds["GuardedProtocol"].add(id(obj))
        elif isinstance(obj, RequestResponseCycle) and obj.scope["server"][1] == port:
            kinds["RequestResponseCycle"].add(id(obj))
        elif (
            (timer := _timer_loop_and_callback(obj)) is not None
            and timer[0] is loop
            and timer[1] is not weakref_handle  # aiohttp's pool cleanup: holds its object weakly
            and getattr(timer[1], "__self__", None) is not app_timer
        ):
            timers[_callback_name(timer[1])] += 1
    tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    return {"objects": dict(kinds), "timers": timers, "tasks": len(tasks)}


def _census_of(gateway: GuardedGateway) -> dict[str, Any]:
    handler = gateway.app.state.proxy
    assert handler is not None
    return gateway.call(_census(gateway.port, handler._write_deadlines._timer))  # type: ignore[no-any-return]


def _settled(gateway: GuardedGateway, baseline: dict[str, Any]) -> dict[str, Any]:
    """What is left beyond the idle baseline: per-request objects, timers, tasks, in-flight counts."""
    now = _census_of(gateway)
    extra_timers = +(now["timers"] - baseline["timers"])
    handler = gateway.app.state.proxy
    assert handler is not None
    before = baseline["objects"]
    new = {kind: len(ids - before.get(kind, set())) for kind, ids in now["objects"].items()}
    left: dict[str, Any] = {
        "objects": {kind: count for kind, count in new.items() if count},
        "timers": dict(extra_timers),
        "tasks": max(0, now["tasks"] - baseline["tasks"]),
        "inflight": gateway.inflight(),
        "active": len(handler._active),
    }
    return {k: v for k, v in left.items() if v}


def _left_after(gateway: GuardedGateway, baseline: dict[str, Any]) -> dict[str, Any]:
    """`_settled` once it is empty, or its last census after `SETTLE_S` (one census may catch a
    background loop's check under way: its timer or task; the next does not)."""
    deadline = time.monotonic() + SETTLE_S
    while (left := _settled(gateway, baseline)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _chat(
    i: int, *, stream: bool, model: str = MODEL, content: str = "hi", max_tokens: int = 8
) -> dict[str, Any]:
    messages = [{"role": "user", "content": f"{content} {i}"}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": stream}


async def _traffic(url: str) -> collections.Counter[str]:
    """`EACH` requests of each kind, eight at a time; the statuses seen, by kind."""
    seen: collections.Counter[str] = collections.Counter()
    limit = asyncio.Semaphore(8)
    path = f"{url}/v1/chat/completions"

    async def whole(client: httpx.AsyncClient, kind: str, body: Any) -> None:
        async with limit:
            response = (
                await client.post(path, json=body)
                if isinstance(body, dict)
                else await client.post(path, content=body)
            )
            seen[f"{kind} {response.status_code}"] += 1

    async def streamed(client: httpx.AsyncClient, kind: str, body: dict[str, Any], *, leave: bool) -> None:
        async with limit, client.stream("POST", path, json=body) as response:
            async for _ in response.aiter_raw():
                if leave:  # the client goes away after the first bytes of a long stream
                    break
            seen[f"{kind} {response.status_code}"] += 1

    async with httpx.AsyncClient(timeout=30.0) as client:
        jobs = []
        for i in range(EACH):
            jobs += [
                whole(client, "whole", _chat(i, stream=False)),
                streamed(client, "stream", _chat(i, stream=True), leave=False),
                streamed(client, "left", _chat(i, stream=True, max_tokens=2000), leave=True),
                whole(client, "unknown-model", _chat(i, stream=False, model="nope")),
                whole(client, "bad-json", b"{not json"),
                whole(client, "upstream-500", _chat(i, stream=False, content=POISON)),
                streamed(client, "upstream-500-stream", _chat(i, stream=True, content=POISON), leave=False),
            ]
        await asyncio.gather(*jobs)
    return seen


async def _preempted(gateway: GuardedGateway) -> collections.Counter[str]:
    """`EACH` long streams, cut by a preemption notice once each has started (no other replica: each
    ends with the terminal error event); the statuses seen."""
    seen: collections.Counter[str] = collections.Counter()
    started = asyncio.Event()
    running = 0
    (replica,) = gateway.app.state.registry.all_replicas()

    async def notice() -> None:  # on the gateway's loop
        gateway.app.state.preemption.notify(replica, 0.0, drain=False)

    async def stream(client: httpx.AsyncClient, i: int) -> None:
        nonlocal running
        body = _chat(i, stream=True, max_tokens=2000)
        async with client.stream("POST", f"{gateway.url}/v1/chat/completions", json=body) as response:
            chunks = response.aiter_raw()
            await anext(chunks)
            running += 1
            if running == EACH:
                started.set()
            async for _ in chunks:
                pass
            seen[f"preempted {response.status_code}"] += 1

    async with httpx.AsyncClient(timeout=30.0) as client:
        streams = [asyncio.create_task(stream(client, i)) for i in range(EACH)]
        await asyncio.wait_for(started.wait(), 10.0)
        await asyncio.to_thread(gateway.call, notice())
        await asyncio.gather(*streams)
    return seen


@pytest.mark.parametrize("gateway", ["asyncio", "uvloop"], indirect=True)
def test_a_finished_request_leaves_nothing_behind(gateway: GuardedGateway) -> None:
    baseline = _census_of(gateway)

    seen = asyncio.run(_traffic(gateway.url))
    seen += asyncio.run(_preempted(gateway))

    assert seen == {
        "whole 200": EACH,
        "stream 200": EACH,
        "left 200": EACH,
        "unknown-model 404": EACH,
        "bad-json 400": EACH,
        "upstream-500 500": EACH,
        "upstream-500-stream 500": EACH,
        "preempted 200": EACH,
    }, seen
    outcome = {"model": MODEL, "outcome": "client_disconnect"}  # the "left" streams were cut mid-way
    assert wait_until(lambda: gateway.metric("requests_total", **outcome) == EACH, SETTLE_S)
    assert _left_after(gateway, baseline) == {}
