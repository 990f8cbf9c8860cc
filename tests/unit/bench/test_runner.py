"""The load runner against a scripted transport: counts, warm-up marking, closed-loop concurrency and
session ordering."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
from collections.abc import Iterator

import httpx

from bench.arrivals import ClosedLoop, Constant
from bench.client import BenchClient, ClientOptions
from bench.progress import Progress
from bench.runner import LoadPlan, run_load
from bench.workload import RequestSpec


class Server:
    """Answers every request after `delay_s`, tracking concurrency overall and per session."""

    def __init__(self, delay_s: float = 0.01) -> None:
        self.delay_s = delay_s
        self.active = 0
        self.max_active = 0
        self.session_active: dict[str, int] = {}
        self.session_overlap = False
        self.order: list[str] = []

    async def handler(self, request: httpx.Request) -> httpx.Response:
        session = request.headers.get("x-session-id", "")
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.session_active[session] = self.session_active.get(session, 0) + 1
        if session and self.session_active[session] > 1:
            self.session_overlap = True
        self.order.append(json.loads(request.content)["messages"][0]["content"])
        await asyncio.sleep(self.delay_s)
        self.active -= 1
        self.session_active[session] -= 1
        return httpx.Response(200, json={"usage": {"completion_tokens": 2}})

    def client(self) -> BenchClient:
        transport = httpx.MockTransport(self.handler)
        return BenchClient(ClientOptions(model="m", stream=False), transport=transport)


def specs(session: str | None = None) -> Iterator[RequestSpec]:
    return (
        RequestSpec(messages=(("user", f"q{i}"),), max_tokens=2, session_id=session)
        for i in itertools.count()
    )


async def test_open_loop_sends_the_count_and_marks_warmup() -> None:
    server = Server()
    client = server.client()
    plan = LoadPlan(Constant(200.0), requests=20, warmup_requests=5)
    out = io.StringIO()
    progress = Progress("t", 20, stream=out, interval_s=0.01, log_interval_s=0.01)
    record = await run_load(plan, specs(), client, lambda s: "http://x", progress=progress)
    await client.aclose()
    assert [s.index for s in record.samples] == list(range(20))
    assert [s.warmup for s in record.samples] == [True] * 5 + [False] * 15
    assert len(record.measured) == 15 and all(s.ok for s in record.samples)
    assert server.order[:3] == ["q0", "q1", "q2"]
    assert record.samples[-1].scheduled_s == 0.1  # 20 / 200 req/s
    assert "20/20 done" in out.getvalue()


async def test_open_loop_duration_bounds_the_sends() -> None:
    server = Server(delay_s=0.0)
    client = server.client()
    record = await run_load(LoadPlan(Constant(100.0), duration_s=0.2), specs(), client, lambda s: "http://x")
    await client.aclose()
    assert len(record.samples) == 19  # offsets 0.01 … 0.19


async def test_closed_loop_never_exceeds_its_concurrency() -> None:
    server = Server(delay_s=0.005)
    client = server.client()
    record = await run_load(LoadPlan(ClosedLoop(4), requests=40), specs(), client, lambda s: "http://x")
    await client.aclose()
    assert len(record.samples) == 40
    assert server.max_active == 4


async def test_turns_of_one_session_never_overlap() -> None:
    server = Server(delay_s=0.01)
    client = server.client()
    plan = LoadPlan(Constant(1000.0), requests=10)
    record = await run_load(plan, specs(session="c1"), client, lambda s: "http://x")
    await client.aclose()
    assert not server.session_overlap
    assert server.order == [f"q{i}" for i in range(10)], "turns in order"
    assert record.samples[-1].lag_s > 0.05, "later turns waited for earlier ones"
