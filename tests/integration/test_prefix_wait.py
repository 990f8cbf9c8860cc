"""Queued requests keep their prefix's replica (`prefix_wait`), through a real gateway and two mock
engines with one slot each: with the replica holding a prompt's prefix busy and the other one free, a
request with that prefix waits for its replica (and is served there, after it frees), while a request
with another prefix takes the free replica at once; with `prefix_wait` off it goes to the free one. The
same with `prefix-affinity`, whose owner is the ring's for the prompt's key.
`/metrics` counts the wait (`prefix_wait_total{outcome="held"|"owner"}`). Nothing stays in flight
afterwards."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import MODEL, pool
from tests.servers import gateway_settings, wait_until

CHAT = "/v1/chat/completions"
SHARED = "You are the on-call assistant of the storage team; answer from the runbook. " * 30
OTHER = "You translate release notes into plain language for customers, briefly. " * 30


def _body(system: str, question: str, max_tokens: int) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens}


async def _prefix_placed(client: httpx.AsyncClient, on: bool, replica: str) -> str:
    """A variant of OTHER whose request the gateway (with every replica free) places on `replica`
    (`on`) or elsewhere (not `on`): a ring sends a prefix to its key's owner, whichever that is."""
    for n in range(64):
        other = f"Variant {n}. {OTHER}"
        probe = await client.post(CHAT, json=_body(other, "probe", 2))
        if (probe.headers["x-gateway-replica"] == replica) == on:
            return other
    raise AssertionError("no prefix placed as asked in 64 tries")


def _scenario(
    gateway_url: str, inflight: object
) -> tuple[httpx.Response, httpx.Response, httpx.Response, float]:
    """Warm the shared prefix on one replica, keep that replica busy with a long request of the same
    prefix, then send one more with the prefix and one with another prefix, which goes to the other
    replica when all are free (for a ring: whose key's owner is the other one)."""

    async def run() -> tuple[httpx.Response, httpx.Response, httpx.Response, float]:
        async with httpx.AsyncClient(base_url=gateway_url, timeout=20) as client:
            warm = await client.post(CHAT, json=_body(SHARED, "warm-up", 2))
            assert warm.status_code == 200
            elsewhere = await _prefix_placed(client, False, warm.headers["x-gateway-replica"])
            busy = asyncio.create_task(client.post(CHAT, json=_body(SHARED, "long answer", 40)))
            assert await asyncio.to_thread(wait_until, lambda: inflight() == 1)  # type: ignore[operator]
            started = time.perf_counter()
            same = asyncio.create_task(client.post(CHAT, json=_body(SHARED, "same prefix", 2)))
            await asyncio.sleep(0.1)
            other = await client.post(CHAT, json=_body(elsewhere, "other prefix", 2))
            other_done_s = time.perf_counter() - started
            return await busy, await same, other, other_done_s

    return asyncio.run(run())


def _prefix_waits(gateway_url: str) -> dict[tuple[str, str], float]:
    """`llm_gateway_prefix_wait_total` and the wait histogram's `_count`, by (sample name, outcome)."""
    text = httpx.get(gateway_url + "/metrics", timeout=5).text
    return {
        (sample.name, sample.labels["outcome"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in ("llm_gateway_prefix_wait_total", "llm_gateway_prefix_wait_seconds_count")
        and sample.labels.get("model") == MODEL
    }


@pytest.mark.parametrize("policy", ["prefix-index", "prefix-affinity"])
def test_a_queued_request_waits_for_the_replica_holding_its_prefix(mock_engines, gateways, policy) -> None:
    """The owner is the index's best match (`prefix-index`) or the key's ring owner, credited by the
    ring's witness (`prefix-affinity`); either way the request holds for it."""
    engines = [mock_engines(model=MODEL, token_delay_ms=20) for _ in range(2)]  # 40 tokens: ~0.8 s
    settings = pool(
        engines,
        policy=policy,
        max_concurrency_per_replica=1,
        slo={"ttft_s": 10.0, "tpot_s": None},  # interactive waits at most 5 s
        prefix_wait={"enabled": True},  # the default, spelled out
    )
    gateway = gateways(gateway_settings([settings]))
    registry = gateway.app.state.registry
    busy, same, other, other_done_s = _scenario(gateway.url, registry.total_inflight)
    assert busy.status_code == same.status_code == other.status_code == 200
    owner = busy.headers["x-gateway-replica"]
    assert same.headers["x-gateway-replica"] == owner, "waited for the replica holding its prefix"
    assert int(same.headers["x-gateway-queue-ms"]) >= 300  # until the long answer ended
    assert other.headers["x-gateway-replica"] != owner
    assert other_done_s < 0.6, "the other prefix took the free replica at once, not behind the holder"
    assert _prefix_waits(gateway.url) == {
        ("llm_gateway_prefix_wait_total", "held"): 1.0,
        ("llm_gateway_prefix_wait_total", "owner"): 1.0,
        ("llm_gateway_prefix_wait_seconds_count", "owner"): 1.0,
    }, "one request waited, and its owner served it"
    assert wait_until(lambda: registry.total_inflight() == 0)
    assert all(r.inflight_requests == 0 for r in registry.all_replicas())


@pytest.mark.parametrize("policy", ["prefix-index", "prefix-affinity"])
def test_without_prefix_wait_the_queued_request_takes_the_free_replica(
    mock_engines, gateways, policy
) -> None:
    engines = [mock_engines(model=MODEL, token_delay_ms=20) for _ in range(2)]
    settings = pool(
        engines,
        policy=policy,
        max_concurrency_per_replica=1,
        slo={"ttft_s": 10.0, "tpot_s": None},
        prefix_wait={"enabled": False},
    )
    gateway = gateways(gateway_settings([settings]))
    registry = gateway.app.state.registry
    busy, same, other, _ = _scenario(gateway.url, registry.total_inflight)
    assert busy.status_code == same.status_code == 200
    assert same.headers["x-gateway-replica"] != busy.headers["x-gateway-replica"]
    assert int(same.headers.get("x-gateway-queue-ms", "0")) < 300
    assert other.status_code in (200, 429)  # both replicas may be busy when it arrives: not the point
    assert _prefix_waits(gateway.url) == {}, "nothing waited for its prefix"
    assert wait_until(lambda: registry.total_inflight() == 0)


def test_a_ring_holds_for_its_keys_owner_this_instance_never_sent_the_prefix_to(
    mock_engines, gateways
) -> None:
    """Two gateway instances without shared state, `prefix-affinity`, one slot per replica each. The
    prompt's prefix is warm on its ring owner through instance A; instance B has never sent it anywhere
    (its witness credits the owner with nothing) and its own slot on the owner is taken by a long
    request of another prefix that maps there too. B's request with the warm prefix waits for the
    owner, as A's would, instead of seeding the prefix on the other replica."""
    engines = [mock_engines(model=MODEL, token_delay_ms=20) for _ in range(2)]
    settings = pool(
        engines,
        policy="prefix-affinity",
        max_concurrency_per_replica=1,
        slo={"ttft_s": 10.0, "tpot_s": None},
    )
    first, second = gateways(gateway_settings([settings])), gateways(gateway_settings([settings]))

    async def run() -> tuple[str, httpx.Response, httpx.Response]:
        async with (
            httpx.AsyncClient(base_url=first.url, timeout=20) as a,
            httpx.AsyncClient(base_url=second.url, timeout=20) as b,
        ):
            warm = await a.post(CHAT, json=_body(SHARED, "warm-up", 2))
            owner = warm.headers["x-gateway-replica"]
            other = await _prefix_placed(a, True, owner)  # another prefix the ring maps there
            learned = await b.post(CHAT, json=_body(other, "a hold time to learn", 2))  # S known
            assert learned.headers["x-gateway-replica"] == owner
            busy = asyncio.create_task(b.post(CHAT, json=_body(other, "long answer", 40)))
            registry = second.app.state.registry
            assert await asyncio.to_thread(wait_until, lambda: registry.total_inflight() == 1)
            same = await b.post(CHAT, json=_body(SHARED, "same prefix", 2))
            return owner, await busy, same

    owner, busy, same = asyncio.run(run())
    assert busy.status_code == same.status_code == 200
    assert busy.headers["x-gateway-replica"] == owner
    assert same.headers["x-gateway-replica"] == owner, "waited for the key's owner, not seeded elsewhere"
    assert int(same.headers["x-gateway-queue-ms"]) >= 300  # until the long answer ended
    waits = _prefix_waits(second.url)
    assert waits[("llm_gateway_prefix_wait_total", "owner")] == 1.0
    for registry in (first.app.state.registry, second.app.state.registry):
        assert wait_until(lambda r=registry: r.total_inflight() == 0)
        assert all(r.inflight_requests == 0 for r in registry.all_replicas())
