"""Fault-matrix rows for a disaggregated pool: poison requests (a prompt the engines of one set fail on,
prefill or decode) mixed into good traffic, through real mock engines in disaggregated roles
(`tests.disagg_fleet`). Each set's failures are judged among its own replicas: two replicas of that set
failing the prompt while both serve others make it a poison request — answered 422 and refused at
arrival after — and no breaker opens on either set; the good traffic is served.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from mock_engine.disagg_params import Protocol, Role
from mock_engine.faults import FaultSettings
from tests.disagg_fleet import disagg_pool, settled
from tests.faults.conftest import MATRIX, DisaggEngines
from tests.faults.traffic import MODEL
from tests.servers import ServerThread, gateway_settings

MARKER = "POISON-PILL"
PROTOCOLS = [Protocol.VLLM, Protocol.SGLANG]
Gateways = Callable[[dict[str, Any]], ServerThread]


async def _send(client: httpx.AsyncClient, text: str, stream: bool) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "stream": stream,
    }
    response = await client.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        return response.headers.get("x-gateway-reject-reason", "NO_REASON")
    if stream and not response.text.rstrip().endswith("data: [DONE]"):
        return "TRUNCATED"
    return "ok"


async def _mixed(url: str, good: int, poison: list[str]) -> tuple[list[str], list[str]]:
    """Good and poison requests interleaved, a few at a time (every other one streamed)."""
    async with httpx.AsyncClient(base_url=url, timeout=15) as client:
        good_tasks, poison_tasks = [], []
        for i in range(max(good, len(poison))):
            if i < good:
                good_tasks.append(asyncio.create_task(_send(client, f"good request {i}", i % 2 == 0)))
            if i < len(poison):
                poison_tasks.append(asyncio.create_task(_send(client, poison[i], i % 2 == 1)))
            await asyncio.sleep(0.02)
        return list(await asyncio.gather(*good_tasks)), list(await asyncio.gather(*poison_tasks))


@pytest.mark.parametrize("poisoned", [Role.PREFILL, Role.DECODE], ids=str)
@pytest.mark.parametrize("protocol", PROTOCOLS, ids=str)
def test_poison_requests_on_a_disaggregated_pool_are_quarantined_and_open_no_breaker(
    protocol: Protocol, poisoned: Role, disagg_engines: DisaggEngines, gateways: Gateways
) -> None:
    """The engines of one set answer 500 to a poison prompt: two replicas of that set fail it while
    both serve others, so it is quarantined (its set's failures are the request's, not the replicas')."""
    poison = FaultSettings(poison_marker=MARKER, poison_effect="error")

    def set_of(role: Role) -> list[ServerThread]:
        return [disagg_engines(role, protocol, poison if role is poisoned else None) for _ in range(2)]

    prefill, decode = set_of(Role.PREFILL), set_of(Role.DECODE)
    pool = disagg_pool(
        MODEL,
        protocol,
        [s.url for s in prefill],
        [s.url for s in decode],
        prefill_policy="round-robin",
        decode_policy="round-robin",
        retries={"budget_ratio": 0.5, "backoff_initial_s": 0.001, "backoff_max_s": 0.01},
        breaker={"consecutive_failures": 3, "open_s": 5.0},
    )
    gateway = gateways(gateway_settings([pool]))
    warm, _ = asyncio.run(_mixed(gateway.url, 6, []))
    assert Counter(warm) == {"ok": 6}
    prompts = [f"{MARKER} number {i}" for i in range(10)]
    good_each, bad_each = asyncio.run(_mixed(gateway.url, 30, prompts))
    good, bad = Counter(good_each), Counter(bad_each)
    name = f"disaggregated ({protocol}): poison ({poisoned} engines fail it)"
    MATRIX[f"{name}, good traffic"] = good
    MATRIX[f"{name}, poison requests"] = bad
    assert good == {"ok": 30}, "good traffic is served, every request"
    assert set(bad) <= {"request_quarantined", "upstream_status"}, bad
    assert bad["request_quarantined"] >= len(prompts) // 2, bad
    replicas = list(gateway.app.state.registry.all_replicas())
    assert all(r.breaker.state == "closed" for r in replicas), [
        (r.replica_id, r.breaker.state) for r in replicas
    ]
    servers = [*prefill, *decode]
    hit = sum(s.app.counters.poisoned_injected for s in servers)
    quarantined = [
        p for p, outcome in zip(prompts, bad_each, strict=True) if outcome == "request_quarantined"
    ]
    _, again = asyncio.run(_mixed(gateway.url, 0, quarantined))
    assert Counter(again) == {"request_quarantined": len(quarantined)}, "refused at arrival"
    assert sum(s.app.counters.poisoned_injected for s in servers) == hit, "no replica was touched"
    settled(gateway, servers)
