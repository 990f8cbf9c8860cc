"""`Idempotency-Key` across gateway instances: the `IdempotencyStore` of `gateway.proxy.stores.idempotency` in
Redis, with the same semantics as the memory `IdempotencyCache` (see that module's docstring).

One hash per scoped key, `{prefix}idem:{h}` (h = a digest of the scope: endpoint, model, client, key):
`digest` (the body's), `state` (`pending` while a leader runs, then `done`), `token` (the leader's random
id, pending only) and, once done, the response: `status`, `headers` (JSON), `enc` + `body` (the body as
UTF-8 text when it is — JSON answers are — else base64). Every change is one atomic script (DESIGN §3):
- claim: no entry → create it pending with the caller's token and a lease (`PEXPIRE lease_s`): the caller
  leads. Another digest → 400 `bad_request`. Done → the response to replay. Pending → its `PTTL`.
- renew: while the token still holds the entry pending, `PEXPIRE lease_s` — the leader renews every
  `lease_s / 3` from a timer task, so a leader whose instance dies frees the key within `lease_s`.
- complete: only the token's holder — store the response (`done`, `PEXPIRE ttl_s`: entries expire
  `ttl_s` after completion) or delete the entry (failed leader: the next duplicate runs), then
  `PUBLISH` on the key's channel `{prefix}idem:{h}:done`.
Expiry is Redis's own (`PEXPIRE`/`PTTL` on the server's clock), the one clock every instance shares.

Waiting for a running leader (on any instance) uses pub/sub, not polling: the waiter subscribes to the
key's channel (confirmed by the server), re-checks with the claim script — so a completion between its
first look and its subscription is never missed — and waits for a message, at most the entry's `PTTL`
(+ `WAKE_SLACK_S`). Every wake (message or timeout) re-runs the claim script: a completed entry is
replayed, a deleted one (failed leader) or an expired lease (dead leader) makes the waiter the leader,
a renewed lease means wait again. Pub/sub rather than `BLPOP` on a per-key list: one `PUBLISH` wakes
every waiter with no count to keep (a list pops one element per waiter), and a blocking command would
exceed the client's short socket timeout; a subscription overrides it per read.

Size: a response whose stored form (headers + body) exceeds `max_stored_bytes` is NOT stored — the claim
is released as for a failed leader, so waiters and later duplicates run again (logged).

Redis unreachable (`state.on_error`, counted in `llm_gateway_state_errors_total{operation}` and logged by
the `RedisBackend`): `fail_open` → `claim` answers None without holding a claim, i.e. the request runs
as if it carried no key (and `complete` ignores it); `fail_closed` → `claim` raises `StateUnavailable`
(503 `state_unavailable`, Retry-After = the outage's age). A leader that cannot reach Redis to complete
leaves its lease to expire.

`ttl_s`, `lease_s` and `max_stored_bytes` are the `idempotency:` settings (`idempotency_store`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import secrets
from dataclasses import dataclass

import orjson

from core.clock import Clock
from core.shared_state import RedisBackend
from core.state_outage import RedisOperation
from gateway.base.errors import BadRequest, StateUnavailable
from gateway.config.settings import (
    DEFAULT_IDEMPOTENCY_LEASE_S,
    DEFAULT_IDEMPOTENCY_MAX_STORED_BYTES,
    DEFAULT_IDEMPOTENCY_TTL_S,
    IdempotencySettings,
)
from gateway.proxy.stores.idempotency import (
    DIFFERENT_BODY_MESSAGE,
    IdempotencyCache,
    IdempotencyStore,
    StoredResponse,
)

logger = logging.getLogger(__name__)

WAKE_SLACK_S = 0.05
_MIN_WAIT_S = 0.01

_CLAIM_LUA = """
-- KEYS[1]: entry. ARGV: now|'' (unused), digest, token, lease_ms.
-- {'leader'} | {'conflict'} | {'pending', pttl_ms} | {'done', status, headers, enc, body}
local e = redis.call('HMGET', KEYS[1], 'digest', 'state', 'status', 'headers', 'enc', 'body')
if not e[1] then
  redis.call('HSET', KEYS[1], 'digest', ARGV[2], 'state', 'pending', 'token', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {'leader'}
end
if e[1] ~= ARGV[2] then return {'conflict'} end
if e[2] == 'done' then return {'done', e[3], e[4], e[5], e[6]} end
return {'pending', redis.call('PTTL', KEYS[1])}
"""

_RENEW_LUA = """
-- KEYS[1]: entry. ARGV: now|'' (unused), token, lease_ms. 1 renewed, 0 lost.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

_COMPLETE_LUA = """
-- KEYS[1]: entry. ARGV: now|'' (unused), token, channel, ttl_ms, then status, headers, enc, body
-- (absent: the leader failed). 1 completed, 0 when the token no longer holds the entry.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[2] then return 0 end
if #ARGV >= 8 then
  redis.call('HSET', KEYS[1], 'state', 'done', 'status', ARGV[5], 'headers', ARGV[6],
             'enc', ARGV[7], 'body', ARGV[8])
  redis.call('HDEL', KEYS[1], 'token')
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
else
  redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', ARGV[3], 'completed')
return 1
"""


def encode_response(response: StoredResponse, max_stored_bytes: int) -> list[str] | None:
    """`[status, headers JSON, enc, body]` as stored, or None when it would exceed `max_stored_bytes`."""
    headers = orjson.dumps([[k.decode("latin-1"), v.decode("latin-1")] for k, v in response.headers])
    try:
        enc, body = "u", response.body.decode("utf-8")
    except UnicodeDecodeError:
        enc, body = "b", base64.b64encode(response.body).decode("ascii")
    if len(headers) + len(body.encode()) > max_stored_bytes:
        return None
    return [str(response.status), headers.decode("utf-8"), enc, body]


def decode_response(status: str, headers: str, enc: str, body: str) -> StoredResponse:
    """The inverse of `encode_response`."""
    pairs = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in orjson.loads(headers)]
    raw = body.encode("utf-8") if enc == "u" else base64.b64decode(body)
    return StoredResponse(int(status), pairs, raw)


@dataclass(frozen=True, slots=True)
class _Reply:
    """A claim script's answer: `kind` is leader | conflict | pending | done."""

    kind: str
    pttl_ms: int = 0
    response: StoredResponse | None = None


@dataclass(frozen=True, slots=True)
class _Lead:
    entry: str
    token: str
    renewal: asyncio.Task[None]


class RedisIdempotencyStore:
    """`IdempotencyStore` in Redis; see the module docstring.

    This instance's claims are remembered by key, as in the memory cache (`complete(key, ...)`), which
    is unambiguous while Redis answers: a key has one leader at a time. During an outage with
    `fail_open` a duplicate may run unclaimed next to a claimed leader on the same instance; whichever
    completes first completes the claim (with a response to the same body) — duplicates may run then
    anyway, which is what `fail_open` accepts.
    """

    def __init__(
        self,
        backend: RedisBackend,
        *,
        ttl_s: float = DEFAULT_IDEMPOTENCY_TTL_S,
        lease_s: float = DEFAULT_IDEMPOTENCY_LEASE_S,
        max_stored_bytes: int = DEFAULT_IDEMPOTENCY_MAX_STORED_BYTES,
    ) -> None:
        self._backend = backend
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._lease_s = lease_s
        self._lease_ms = max(1, round(lease_s * 1000))
        self._max_stored_bytes = max_stored_bytes
        self._claim = backend.register(_CLAIM_LUA)
        self._renew = backend.register(_RENEW_LUA)
        self._complete = backend.register(_COMPLETE_LUA)
        self._leading: dict[tuple[str, ...], _Lead] = {}

    async def claim(self, key: tuple[str, ...], digest: bytes) -> StoredResponse | None:
        """See `IdempotencyStore.claim`; waits for a leader on any instance (module docstring)."""
        entry, token, hex_digest = self._entry(key), secrets.token_hex(12), digest.hex()
        reply = await self._claim_once(entry, hex_digest, token)
        if reply is not None and reply.kind == "pending":
            reply = await self._wait(entry, hex_digest, token)
        if reply is None:
            self._on_unreachable()
            return None
        if reply.kind == "conflict":
            raise BadRequest(DIFFERENT_BODY_MESSAGE)
        if reply.kind == "done":
            return reply.response
        renewal = asyncio.create_task(self._keep_lease(entry, token))
        replaced = self._leading.get(key)
        if replaced is not None:  # an earlier claim of ours whose lease was lost (renewals failed)
            replaced.renewal.cancel()
        self._leading[key] = _Lead(entry, token, renewal)
        return None

    async def complete(self, key: tuple[str, ...], response: StoredResponse | None) -> None:
        """See `IdempotencyStore.complete`. A claim taken without Redis (fail_open) has nothing to
        complete; a response above `max_stored_bytes` is not stored (the claim is released)."""
        lead = self._leading.pop(key, None)
        if lead is None:
            return
        lead.renewal.cancel()
        stored = None if response is None else encode_response(response, self._max_stored_bytes)
        if response is not None and stored is None:
            logger.info("idempotent response over %d bytes not stored", self._max_stored_bytes)
        args = [lead.token, self._channel(lead.entry), str(self._ttl_ms), *(stored or [])]
        # Shielded: a client that leaves during this call must not leave the claim pending.
        await asyncio.shield(
            self._backend.run(RedisOperation.IDEMPOTENCY_COMPLETE, self._complete, [lead.entry], args)
        )

    async def _claim_once(self, entry: str, hex_digest: str, token: str) -> _Reply | None:
        args = [hex_digest, token, str(self._lease_ms)]
        reply = await self._backend.run(RedisOperation.IDEMPOTENCY_CLAIM, self._claim, [entry], args)
        if reply is None:
            return None
        kind = str(reply[0])
        if kind == "pending":
            return _Reply(kind, pttl_ms=int(reply[1]))
        if kind == "done":
            return _Reply(kind, response=decode_response(*reply[1:5]))
        return _Reply(kind)

    async def _wait(self, entry: str, hex_digest: str, token: str) -> _Reply | None:
        """Subscribe, then re-check and wait until the entry is no longer pending (None: unreachable)."""
        async with self._backend.subscribe(RedisOperation.IDEMPOTENCY_WAIT, self._channel(entry)) as sub:
            if sub is None:
                return None
            while True:
                reply = await self._claim_once(entry, hex_digest, token)
                if reply is None or reply.kind != "pending":
                    return reply
                if not await sub.wait(self._wait_bound_s(reply.pttl_ms)):
                    return None

    def _wait_bound_s(self, pttl_ms: int) -> float:
        if pttl_ms < 0:  # no expiry (cannot happen with the scripts above): fall back to a lease
            return self._lease_s
        return min(self._lease_s, max(_MIN_WAIT_S, pttl_ms / 1000 + WAKE_SLACK_S))

    async def _keep_lease(self, entry: str, token: str) -> None:
        """Renew the leader's lease every lease/3 until cancelled or lost (unreachable: keep trying)."""
        args = [token, str(self._lease_ms)]
        while True:
            await asyncio.sleep(self._lease_s / 3)
            reply = await self._backend.run(RedisOperation.IDEMPOTENCY_RENEW, self._renew, [entry], args)
            if reply is not None and int(reply) == 0:
                return

    def _on_unreachable(self) -> None:
        """fail_open: the request runs without a claim; fail_closed: 503."""
        if self._backend.fail_open:
            return
        raise StateUnavailable(
            "shared state (Redis) is unreachable: Idempotency-Key cannot be honoured",
            retry_after_s=self._backend.outage_retry_after_s(),
        )

    def _entry(self, key: tuple[str, ...]) -> str:
        return self._backend.key("idem", hashlib.sha256(orjson.dumps(list(key))).hexdigest()[:32])

    def _channel(self, entry: str) -> str:
        return entry + ":done"


def idempotency_store(
    backend: RedisBackend | None, clock: Clock, settings: IdempotencySettings
) -> IdempotencyStore:
    """The Redis store on the shared-state backend when there is one, else the memory cache (which
    has no lease: its leaders run in this process and always complete)."""
    if backend is None:
        return IdempotencyCache(clock, settings.ttl_s, max_stored_bytes=settings.max_stored_bytes)
    return RedisIdempotencyStore(
        backend, ttl_s=settings.ttl_s, lease_s=settings.lease_s, max_stored_bytes=settings.max_stored_bytes
    )
