from __future__ import annotations

import asyncio

import pytest

from admission.clock import FakeClock
from gateway.errors import BadRequest
from gateway.proxy.idempotency import IdempotencyCache, StoredResponse, body_digest

KEY = ("m", "client", "k1")
OK = StoredResponse(200, [(b"content-type", b"application/json")], b"{}")


async def test_first_claim_leads_then_duplicates_replay() -> None:
    cache = IdempotencyCache(FakeClock())
    assert await cache.claim(KEY, body_digest(b"a")) is None
    await cache.complete(KEY, OK)
    assert await cache.claim(KEY, body_digest(b"a")) == OK


async def test_concurrent_duplicate_waits_for_the_leader() -> None:
    cache = IdempotencyCache(FakeClock())
    assert await cache.claim(KEY, body_digest(b"a")) is None
    waiter = asyncio.create_task(cache.claim(KEY, body_digest(b"a")))
    await asyncio.sleep(0)
    assert not waiter.done()
    await cache.complete(KEY, OK)
    assert await waiter == OK


async def test_failed_leader_hands_over_to_the_next_duplicate() -> None:
    cache = IdempotencyCache(FakeClock())
    assert await cache.claim(KEY, body_digest(b"a")) is None
    waiter = asyncio.create_task(cache.claim(KEY, body_digest(b"a")))
    await asyncio.sleep(0)
    await cache.complete(KEY, None)
    assert await waiter is None, "the waiter becomes the new leader"


async def test_different_body_is_a_bad_request_and_entries_expire() -> None:
    clock = FakeClock()
    cache = IdempotencyCache(clock, ttl_s=10)
    await cache.claim(KEY, body_digest(b"a"))
    await cache.complete(KEY, OK)
    with pytest.raises(BadRequest):
        await cache.claim(KEY, body_digest(b"b"))
    clock.advance(11)
    assert await cache.claim(KEY, body_digest(b"b")) is None


async def test_bounded_entries() -> None:
    cache = IdempotencyCache(FakeClock(), max_entries=2)
    for i in range(5):
        key = ("m", "c", str(i))
        await cache.claim(key, b"")
        await cache.complete(key, OK)
    assert len(cache._entries) == 2
