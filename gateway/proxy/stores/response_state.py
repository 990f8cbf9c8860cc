"""Where each stored Responses-API response lives: response id → (pool, replica), bounded, with a TTL.

Engines keep Responses state in memory (vLLM's response store): a request with `previous_response_id`,
and every `/v1/responses/{id}` call, must reach the replica that produced the id
(`gateway.proxy.response_affinity`). The gateway remembers the replica of every response id it relays.

- `MemoryResponseState`: an insertion-ordered map of at most `max_entries` (the oldest are dropped
  first), each entry valid for `ttl_s` from its last write (default `DEFAULT_TTL_S`, 24 h: longer than a
  conversation's pause, shorter than most engine uptimes). Time from the injected clock.
- `RedisResponseState` (`state.backend: redis`): the same map in Redis so every gateway instance agrees,
  one key per id, `{prefix}resp:{id}` = JSON `[model, replica_id]` (with tenants the id is the
  owner-scoped one, `gateway.proxy.response_affinity.stored_key`), written with `SET … PX ttl` and read
  with `GET`, each one script (Redis expires entries; no size bound beyond memory). Every write also goes
  to a local `MemoryResponseState`, read when Redis is unreachable (`state.on_error` `fail_open`: the
  ids this instance relayed still route; others are unknown) — with `fail_closed` an unreachable Redis
  is a 503 `state_unavailable`.

`delete` drops an id once its response was deleted on the engine (a successful
`DELETE /v1/responses/{id}`), so the gateway answers a later call on it with `response_not_found`
instead of forwarding it. It never fails: the engine already deleted the response and the client has
its answer, so an unreachable Redis (either mode) only leaves the shared key to expire by its TTL;
the local copy is dropped in any case, and a later call that still finds the key is forwarded and
answered by the engine's own 404.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple, Protocol

import orjson

from core.clock import Clock
from core.shared_state import RedisBackend
from core.state_outage import RedisOperation
from gateway.base.errors import StateUnavailable

DEFAULT_TTL_S = 24 * 3600.0
DEFAULT_MAX_ENTRIES = 100_000

_PUT_LUA = """
-- KEYS[1]: entry. ARGV: now|'' (unused), value, ttl_ms.
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""
_DELETE_LUA = """
-- KEYS[1]: entry. ARGV: now|'' (unused).
redis.call('DEL', KEYS[1])
return 1
"""
_GET_LUA = """
-- KEYS[1]: entry. ARGV: now|'' (unused). The value, or '' when absent (scripts never return nil).
local v = redis.call('GET', KEYS[1])
if not v then return '' end
return v
"""


class ResponseLocation(NamedTuple):
    """The pool (client-facing model) and replica that hold one stored response."""

    model: str
    replica_id: str


class ResponseState(Protocol):
    """Response id → its location (module docstring)."""

    async def get(self, response_id: str) -> ResponseLocation | None: ...

    async def put(self, response_id: str, location: ResponseLocation) -> None: ...

    async def delete(self, response_id: str) -> None: ...


class MemoryResponseState:
    """This instance's map (module docstring): bounded to `max_entries`, entries expire `ttl_s` after
    their last write."""

    def __init__(
        self, clock: Clock, *, ttl_s: float = DEFAULT_TTL_S, max_entries: int = DEFAULT_MAX_ENTRIES
    ) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._entries: OrderedDict[str, tuple[ResponseLocation, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, response_id: str) -> ResponseLocation | None:
        return self.get_now(response_id)

    def get_now(self, response_id: str) -> ResponseLocation | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        location, expires_s = entry
        if self._clock.now_s() >= expires_s:
            del self._entries[response_id]
            return None
        return location

    async def put(self, response_id: str, location: ResponseLocation) -> None:
        self.put_now(response_id, location)

    def put_now(self, response_id: str, location: ResponseLocation) -> None:
        self._entries.pop(response_id, None)
        self._entries[response_id] = (location, self._clock.now_s() + self._ttl_s)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    async def delete(self, response_id: str) -> None:
        self.delete_now(response_id)

    def delete_now(self, response_id: str) -> None:
        self._entries.pop(response_id, None)


class RedisResponseState:
    """The map in Redis, shared by every gateway instance (module docstring)."""

    def __init__(self, backend: RedisBackend, local: MemoryResponseState, *, ttl_s: float = DEFAULT_TTL_S):
        self._backend = backend
        self._local = local
        self._ttl_ms = int(ttl_s * 1000)
        self._put = backend.register(_PUT_LUA)
        self._get = backend.register(_GET_LUA)
        self._delete = backend.register(_DELETE_LUA)

    async def get(self, response_id: str) -> ResponseLocation | None:
        reply = await self._backend.run(
            RedisOperation.RESPONSE_STATE_GET, self._get, [self._key(response_id)], []
        )
        if reply is None:  # unreachable
            if not self._backend.fail_open:
                raise StateUnavailable(
                    "shared state is unreachable: the replica holding this response is unknown",
                    retry_after_s=self._backend.outage_retry_after_s(),
                )
            return self._local.get_now(response_id)
        if not reply:
            return None
        model, replica_id = orjson.loads(reply)
        return ResponseLocation(str(model), str(replica_id))

    async def put(self, response_id: str, location: ResponseLocation) -> None:
        self._local.put_now(response_id, location)
        value = orjson.dumps([location.model, location.replica_id]).decode()
        await self._backend.run(
            RedisOperation.RESPONSE_STATE_PUT, self._put, [self._key(response_id)], [value, self._ttl_ms]
        )

    async def delete(self, response_id: str) -> None:
        self._local.delete_now(response_id)
        await self._backend.run(
            RedisOperation.RESPONSE_STATE_DELETE, self._delete, [self._key(response_id)], []
        )

    def _key(self, response_id: str) -> str:
        return self._backend.key("resp", response_id)


def response_state_store(backend: RedisBackend | None, clock: Clock) -> ResponseState:
    """Redis-backed with a Redis state backend, else this instance's memory."""
    local = MemoryResponseState(clock)
    return local if backend is None else RedisResponseState(backend, local)
