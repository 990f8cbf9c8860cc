"""Poison-request quarantine: a request that broke two replicas is not sent to a third, and neither is
an identical one for a while.

The serve loop quarantines a request when failure attribution (`gateway.proxy.failure_attribution`)
charges two of its failed attempts, on two different replicas that both kept serving other requests,
to the request itself. The client gets 422 `request_quarantined` (a retry fails the same way), and the
request's fingerprint is remembered for the pool's `quarantine.ttl_s`: an identical request is refused
at arrival, before admission, without touching a replica.

Fingerprint: blake2b-128 of the endpoint, the client-facing model and the prompt-bearing fields of the
body (`PROMPT_FIELDS`: messages, prompt, input, tokens, tools, tool_choice, functions, response_format), each
serialised with sorted keys. Two requests that differ only in sampling parameters, `max_tokens`,
`stream` or `user` share a fingerprint (the prompt is what broke the engines); any change to the prompt
or the tools gives a new one. The fingerprint is computed at arrival only while the pool has a
quarantined entry (`QuarantineStore.active`), so the common case costs one attribute read.

Stores: `MemoryQuarantine` (this instance; an LRU of `max_entries` with expiry) and, with
`state.backend: redis`, `gateway.proxy.stores.quarantine_redis.RedisQuarantine` (every instance agrees).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Protocol

import orjson

from core.clock import Clock
from gateway.api.request_parsing import ParsedRequest

PROMPT_FIELDS = (
    "messages",
    "prompt",
    "input",
    "tokens",
    "tools",
    "tool_choice",
    "functions",
    "response_format",
)


def fingerprint(parsed: ParsedRequest, model: str) -> str:
    """The request's quarantine fingerprint (module docstring), 32 hex digits."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(parsed.endpoint.value.encode())
    digest.update(b"\0" + model.encode())
    for name in PROMPT_FIELDS:
        value = parsed.body.get(name)
        if value is not None:
            digest.update(b"\0" + name.encode() + b"=")
            digest.update(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))
    return digest.hexdigest()


class QuarantineStore(Protocol):
    """Quarantined fingerprints of one pool."""

    @property
    def active(self) -> bool:
        """False when nothing is quarantined (arrivals skip the fingerprint)."""
        ...

    def contains(self, key: str) -> bool:
        """True while `key` is quarantined (synchronous: a local read)."""
        ...

    async def add(self, key: str) -> None:
        """Quarantine `key` for the pool's TTL."""
        ...


class MemoryQuarantine:
    """This instance's quarantine: an LRU of at most `max_entries` fingerprints, each for `ttl_s`."""

    def __init__(self, clock: Clock, ttl_s: float, max_entries: int) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._expires_s: OrderedDict[str, float] = OrderedDict()

    @property
    def active(self) -> bool:
        return bool(self._expires_s)

    def contains(self, key: str) -> bool:
        expires_s = self._expires_s.get(key)
        if expires_s is None:
            return False
        if expires_s <= self._clock.now_s():
            del self._expires_s[key]
            return False
        return True

    async def add(self, key: str) -> None:
        self.put(key, self._clock.now_s() + self._ttl_s)

    def put(self, key: str, expires_s: float) -> None:
        """Hold `key` until `expires_s` (clock time); the least recently added entry goes first."""
        self._expires_s[key] = expires_s
        self._expires_s.move_to_end(key)
        while len(self._expires_s) > self._max_entries:
            self._expires_s.popitem(last=False)

    def replace_all(self, entries: dict[str, float]) -> None:
        """Take `entries` (fingerprint → expiry, clock time) as the whole quarantine (a shared sync)."""
        self._expires_s = OrderedDict(sorted(entries.items(), key=lambda item: item[1]))
        while len(self._expires_s) > self._max_entries:
            self._expires_s.popitem(last=False)
