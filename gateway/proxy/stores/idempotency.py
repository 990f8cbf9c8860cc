"""`Idempotency-Key` for non-streaming requests: a duplicate gets the first response, never a second
generation.

Scope of a key: (endpoint, model, client, Idempotency-Key); the client is the tenant when tenants are
configured (whichever of its keys, and whichever header — `Authorization` or `x-api-key` — carried it),
else the `Authorization` header. Another tenant's key is another record: never replayed, never a 400.
- the first request with a key is the *leader*: it runs, and a 2xx answer is stored — unless its headers
  + body exceed `max_stored_bytes`: then it is answered, but released as by a failed leader (below);
- a duplicate that arrives while the leader runs waits for it and replays its answer;
- a duplicate within `ttl_s` of the leader's completion replays the stored answer (with
  `x-gateway-idempotent-replay: true`); after that the key is new again;
- a leader that fails (error status, disconnect, timeout) stores nothing: waiters wake up and the
  next one becomes the leader, so a client retry after an error really retries;
- the same key with a different body is a 400 `bad_request` (a client bug, not a duplicate).
`IdempotencyStore` is what the handler depends on. `IdempotencyCache` keeps entries in memory (per
gateway instance), bounded by `max_entries` (oldest evicted first); with `state.backend: redis`,
`gateway.proxy.stores.idempotency_redis.RedisIdempotencyStore` gives the same semantics across instances.
Streaming requests are not covered: a stream cannot be replayed byte-exact without buffering it all.
`ttl_s`, `max_stored_bytes` (and the Redis store's `lease_s`) are the `idempotency:` settings
(`gateway.config.settings.IdempotencySettings`), and so are the defaults.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from core.clock import Clock
from gateway.api.asgi_io import Message, Send
from gateway.base.errors import BadRequest
from gateway.config.settings import DEFAULT_IDEMPOTENCY_MAX_STORED_BYTES, DEFAULT_IDEMPOTENCY_TTL_S

logger = logging.getLogger(__name__)

DEFAULT_MAX_ENTRIES = 10_000
REPLAY_HEADER = b"x-gateway-idempotent-replay"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass(slots=True)
class _Entry:
    body_digest: bytes
    expires_at_s: float = math.inf  # set when a response is stored: `ttl_s` after completion
    response: StoredResponse | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


def body_digest(raw: bytes) -> bytes:
    return hashlib.sha256(raw).digest()


def stored_size_bytes(response: StoredResponse) -> int:
    """What `max_stored_bytes` bounds in memory: header names and values plus the body."""
    return sum(len(name) + len(value) for name, value in response.headers) + len(response.body)


DIFFERENT_BODY_MESSAGE = "Idempotency-Key was already used with a different request body"


class IdempotencyStore(Protocol):
    """Claim a key, then complete it: the contract of the module docstring."""

    async def claim(self, key: tuple[str, ...], digest: bytes) -> StoredResponse | None:
        """A stored response to replay (waiting for a running leader first), or None when the caller
        is now the leader for `key` and must call `complete` exactly once.
        Raises `BadRequest` when `key` was claimed with another body `digest`."""
        ...

    async def complete(self, key: tuple[str, ...], response: StoredResponse | None) -> None:
        """The leader's outcome: a response to store, or None (failed: the next duplicate runs)."""
        ...


class IdempotencyCache:
    """`IdempotencyStore` in memory; see the module docstring."""

    def __init__(
        self,
        clock: Clock,
        ttl_s: float = DEFAULT_IDEMPOTENCY_TTL_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        *,
        max_stored_bytes: int = DEFAULT_IDEMPOTENCY_MAX_STORED_BYTES,
    ) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._max_stored_bytes = max_stored_bytes
        self._entries: OrderedDict[tuple[str, ...], _Entry] = OrderedDict()

    async def claim(self, key: tuple[str, ...], digest: bytes) -> StoredResponse | None:
        """Return a stored response to replay, or None when the caller is now the leader for `key`
        (it must then call `complete` exactly once)."""
        while True:
            entry = self._live_entry(key)
            if entry is None:
                self._entries[key] = _Entry(digest)
                self._evict_overflow()
                return None
            if entry.body_digest != digest:
                raise BadRequest(DIFFERENT_BODY_MESSAGE)
            if entry.response is not None:
                return entry.response
            await entry.done.wait()

    async def complete(self, key: tuple[str, ...], response: StoredResponse | None) -> None:
        """The leader's outcome: a response to store, or None (failed: the next duplicate runs). A
        response above `max_stored_bytes` is not stored (the claim is released, as for a failure)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        if response is not None and stored_size_bytes(response) > self._max_stored_bytes:
            logger.info("idempotent response over %d bytes not stored", self._max_stored_bytes)
            response = None
        if response is None:
            del self._entries[key]
        else:
            entry.response = response
            entry.expires_at_s = self._clock.now_s() + self._ttl_s
        entry.done.set()

    def _live_entry(self, key: tuple[str, ...]) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.response is not None and entry.expires_at_s <= self._clock.now_s():
            del self._entries[key]
            return None
        return entry

    def _evict_overflow(self) -> None:
        while len(self._entries) > self._max_entries:
            _, oldest = self._entries.popitem(last=False)
            oldest.done.set()


class ResponseRecorder:
    """Wraps an ASGI `send` and keeps what a complete, buffered response sent (for storing)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._status = message["status"]
            self._headers = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
        else:
            self._body.append(message.get("body", b""))
        await self._send(message)

    def stored(self) -> StoredResponse | None:
        """The response if it was a success worth replaying, else None."""
        if not 200 <= self._status < 300:
            return None
        return StoredResponse(self._status, self._headers, b"".join(self._body))


def replay_headers(stored: StoredResponse, request_id: str) -> list[tuple[str, str]]:
    headers = [
        (k.decode("latin-1"), v.decode("latin-1")) for k, v in stored.headers if k != b"content-length"
    ]
    return [*headers, (REPLAY_HEADER.decode(), "true"), ("x-request-id", request_id)]


def idempotency_scope(endpoint: str, model: str, client: str | None, key: str) -> tuple[str, ...]:
    """Cache key: the endpoint (method and upstream path: `POST /v1/chat/completions`, `GET
    /v1/responses/resp_1`), the model, a digest of the client (`tenant:<name>` with tenants, else its
    credentials: never the key itself), the header — the same key on chat and on completions, on two
    response ids, or from two tenants, names two requests."""
    digest = hashlib.sha256((client or "").encode()).hexdigest()[:32]
    return (endpoint, model, digest, key)
