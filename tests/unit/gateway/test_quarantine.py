"""Quarantine fingerprints and the memory store (gateway.proxy.stores.quarantine)."""

from __future__ import annotations

import orjson

from core.clock import FakeClock
from gateway.api.request_parsing import Endpoint, parse_request
from gateway.proxy.stores.quarantine import MemoryQuarantine, fingerprint


def chat(**fields: object) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "crash me"}], **fields}
    return orjson.dumps(body)


def print_of(raw: bytes, endpoint: Endpoint = Endpoint.CHAT, model: str = "m") -> str:
    return fingerprint(parse_request(endpoint, raw), model)


def test_the_fingerprint_is_the_prompt_not_the_sampling() -> None:
    base = print_of(chat())
    assert print_of(chat(temperature=0.3, max_tokens=5, stream=True, user="u1")) == base
    assert print_of(chat(messages=[{"content": "crash me", "role": "user"}])) == base, "key order"
    assert print_of(chat(messages=[{"role": "user", "content": "crash me!"}])) != base
    assert print_of(chat(tools=[{"type": "function", "function": {"name": "f"}}])) != base
    assert print_of(chat(), model="other") != base
    completions = orjson.dumps({"model": "m", "prompt": "crash me"})
    assert print_of(completions, Endpoint.COMPLETIONS) != base
    assert len(base) == 32


async def test_memory_quarantine_expires_and_keeps_at_most_max_entries() -> None:
    clock = FakeClock(start_s=0.0)
    store = MemoryQuarantine(clock, ttl_s=10.0, max_entries=2)
    assert not store.active and not store.contains("a")
    await store.add("a")
    assert store.active and store.contains("a")
    clock.advance(5.0)
    await store.add("b")
    await store.add("c")  # over the cap: the oldest entry goes
    assert not store.contains("a") and store.contains("b") and store.contains("c")
    clock.advance(10.0)
    assert not store.contains("b") and not store.contains("c"), "expired after ttl_s"
    assert not store.active


async def test_a_failing_sync_is_counted_and_the_loop_goes_on() -> None:
    import asyncio

    from gateway.proxy.stores.quarantine_redis import QuarantineSync

    class Broken:
        calls = 0

        async def sync(self) -> bool:
            Broken.calls += 1
            raise RuntimeError("script bug")

    errors: list[int] = []
    loop = QuarantineSync([Broken()], interval_s=0.001, on_error=lambda: errors.append(1))  # type: ignore[list-item]
    loop.start()
    for _ in range(200):
        if Broken.calls >= 3:
            break
        await asyncio.sleep(0.002)
    await loop.stop()
    assert Broken.calls >= 3 and len(errors) >= 3, "each failure counted, the loop kept going"
