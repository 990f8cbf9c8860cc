from __future__ import annotations

import asyncio

import pytest

from core.clock import FakeClock
from gateway.base.errors import BadRequest
from gateway.config.settings import DEFAULT_IDEMPOTENCY_MAX_STORED_BYTES, IdempotencySettings
from gateway.proxy.stores.idempotency import (
    IdempotencyCache,
    StoredResponse,
    body_digest,
    stored_size_bytes,
)
from gateway.proxy.stores.idempotency_redis import idempotency_store

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


async def test_a_configured_ttl_counts_from_completion() -> None:
    clock = FakeClock()
    cache = idempotency_store(None, clock, IdempotencySettings(ttl_s=30))
    assert await cache.claim(KEY, body_digest(b"a")) is None
    clock.advance(100)  # a leader that ran longer than the ttl
    await cache.complete(KEY, OK)
    clock.advance(29.9)
    assert await cache.claim(KEY, body_digest(b"a")) == OK
    clock.advance(0.1)
    assert await cache.claim(KEY, body_digest(b"a")) is None, "expired: the key runs again"


async def test_a_configured_size_limit_leaves_larger_responses_unstored() -> None:
    limit = stored_size_bytes(OK)  # headers + body
    assert limit == len(b"content-type") + len(b"application/json") + len(b"{}")
    cache = idempotency_store(None, FakeClock(), IdempotencySettings(max_stored_bytes=limit))
    assert await cache.claim(KEY, body_digest(b"a")) is None
    await cache.complete(KEY, OK)
    assert await cache.claim(KEY, body_digest(b"a")) == OK, "at the limit: stored"

    big = StoredResponse(200, OK.headers, b"{ }")
    other = ("m", "client", "k2")
    assert await cache.claim(other, body_digest(b"a")) is None
    waiter = asyncio.create_task(cache.claim(other, body_digest(b"a")))
    await asyncio.sleep(0)
    await cache.complete(other, big)
    assert await waiter is None, "one byte over: not stored, the waiter leads and runs again"
    await cache.complete(other, None)
    assert await cache.claim(other, body_digest(b"a")) is None, "and nothing was kept"


async def test_default_settings_keep_the_default_size_limit() -> None:
    cache = idempotency_store(None, FakeClock(), IdempotencySettings())
    huge = StoredResponse(200, [], b"x" * (DEFAULT_IDEMPOTENCY_MAX_STORED_BYTES + 1))
    assert await cache.claim(KEY, body_digest(b"a")) is None
    await cache.complete(KEY, huge)
    assert await cache.claim(KEY, body_digest(b"a")) is None
