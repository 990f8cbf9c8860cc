"""Poison evidence shared by every gateway instance through Redis (see
`gateway.proxy.stores.poison_evidence`).

One hash per pool, `{prefix}evidence:{model}`: field = fingerprint, value = its sightings, one per line,
`<time>|<kind>|<replica id>` (time: Redis server `TIME`, seconds). Three atomic scripts:
- add: drop the fingerprint's sightings older than the window and the one of the same replica and kind,
  append the new one (a new fingerprint is not stored while the hash holds `max_entries`), keep the key
  alive for the window, and return the fingerprint's sightings with their ages;
- clear: delete the fingerprint's field;
- sync: drop every sighting older than the window, return every fingerprint's live sightings with
  their ages.

Reads never wait for Redis: `sightings` reads a local mirror (`MemoryEvidence`), which a sync refreshes
every second (the quarantine's sync loop, `gateway.proxy.stores.quarantine_redis.QuarantineSync`) and `add`
updates at once with what Redis returned. An instance thus sees where another saw a fingerprint fail
within about a second, and at once when it adds a sighting of its own.

Redis unreachable (counted in `llm_gateway_state_errors_total{operation="evidence_add" |
"evidence_clear" | "evidence_sync"}`): `add` and `clear` act on the local mirror only, and the mirror
keeps its sightings (each expires on its own) until a sync reaches Redis again. Evidence is a
protection, not an admission decision: `state.on_error` does not apply.
"""

from __future__ import annotations

from core.clock import Clock
from core.shared_state import LUA_PRELUDE, RedisBackend
from core.state_outage import RedisOperation
from gateway.proxy.stores.poison_evidence import MemoryEvidence, Sighting
from gateway.upstream.failure_kinds import FailureKind

_PARSE_LUA = """
local function live(value, now, window)
  local kept, total = {}, 0
  for line in string.gmatch(value or '', '[^\\n]+') do
    total = total + 1
    local at = tonumber(string.match(line, '^([^|]+)|'))
    if at and at > now - window then kept[#kept + 1] = line end
  end
  return kept, total
end
local function aged(lines, now)
  local out = {}
  for _, line in ipairs(lines) do
    local at, rest = string.match(line, '^([^|]+)|(.+)$')
    out[#out + 1] = fmt(now - tonumber(at)) .. '|' .. rest
  end
  return table.concat(out, '\\n')
end
"""

_ADD_LUA = (
    LUA_PRELUDE
    + _PARSE_LUA
    + """
-- KEYS[1]: the pool's hash. ARGV: now|'', window_s, max_entries, fingerprint, kind, replica id.
local now, window, cap = now_s(), tonumber(ARGV[2]), tonumber(ARGV[3])
local old = redis.call('HGET', KEYS[1], ARGV[4])
local suffix = '|' .. ARGV[5] .. '|' .. ARGV[6]
local kept = {}
local alive = live(old, now, window)
for _, line in ipairs(alive) do
  if string.sub(line, -#suffix) ~= suffix then kept[#kept + 1] = line end
end
kept[#kept + 1] = fmt(now) .. suffix
if old or redis.call('HLEN', KEYS[1]) < cap then
  redis.call('HSET', KEYS[1], ARGV[4], table.concat(kept, '\\n'))
  local keep = math.ceil(window * 1000) + 1000
  if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
end
return aged(kept, now)
"""
)

_CLEAR_LUA = (
    LUA_PRELUDE
    + """
-- KEYS[1]: the pool's hash. ARGV: now|'', fingerprint.
redis.call('HDEL', KEYS[1], ARGV[2])
return 1
"""
)

_SYNC_LUA = (
    LUA_PRELUDE
    + _PARSE_LUA
    + """
-- KEYS[1]: the pool's hash. ARGV: now|'', window_s. Returns {fingerprint, aged sightings, ...}.
local now, window = now_s(), tonumber(ARGV[2])
local out = {}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local kept, total = live(fields[i + 1], now, window)
  if #kept == 0 then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    if #kept < total then redis.call('HSET', KEYS[1], fields[i], table.concat(kept, '\\n')) end
    out[#out + 1] = fields[i]
    out[#out + 1] = aged(kept, now)
  end
end
return out
"""
)


def _parse(aged: str, now_s: float) -> list[Sighting]:
    """Sightings from the scripts' `<age>|<kind>|<replica id>` lines, timed on this instance's clock."""
    found = []
    for line in str(aged).splitlines():
        age, kind, replica_id = line.split("|", 2)
        try:
            found.append(Sighting(replica_id, FailureKind(kind), now_s - float(age)))
        except ValueError:
            continue  # a kind this version does not know (a newer instance's): no evidence here
    return found


class RedisEvidence:
    """A pool's poison evidence in Redis with a local mirror (module docstring)."""

    def __init__(
        self, backend: RedisBackend, model: str, clock: Clock, *, window_s: float, max_entries: int
    ) -> None:
        self._backend = backend
        self._key = backend.key("evidence", model)
        self._clock = clock
        self._window_s = window_s
        self._max_entries = max_entries
        self._local = MemoryEvidence(clock, window_s, max_entries)
        self._add = backend.register(_ADD_LUA)
        self._clear = backend.register(_CLEAR_LUA)
        self._sync = backend.register(_SYNC_LUA)

    @property
    def active(self) -> bool:
        return self._local.active

    def sightings(self, key: str) -> tuple[Sighting, ...]:
        return self._local.sightings(key)

    async def add(self, key: str, replica_id: str, kind: FailureKind) -> tuple[Sighting, ...]:
        mine = await self._local.add(key, replica_id, kind)
        args = [repr(self._window_s), str(self._max_entries), key, str(kind), replica_id]
        reply = await self._backend.run(RedisOperation.EVIDENCE_ADD, self._add, [self._key], args)
        if reply is None:
            return mine
        return self._local.put(key, _parse(reply, self._clock.now_s()))

    async def clear(self, key: str) -> None:
        await self._local.clear(key)
        await self._backend.run(RedisOperation.EVIDENCE_CLEAR, self._clear, [self._key], [key])

    async def sync(self) -> bool:
        """Refresh the local mirror from Redis; False when Redis was unreachable (mirror kept)."""
        reply = await self._backend.run(
            RedisOperation.EVIDENCE_SYNC, self._sync, [self._key], [repr(self._window_s)]
        )
        if reply is None:
            return False
        now_s = self._clock.now_s()
        pairs = zip(reply[0::2], reply[1::2], strict=True)
        self._local.replace_all({str(key): _parse(aged, now_s) for key, aged in pairs})
        return True
