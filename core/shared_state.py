"""Shared state in Redis: the connection with its failure policy, used by every layer that shares state.

This is the only module that imports `redis`. `RedisBackend` owns the client and runs registered Lua
scripts; every change to shared state is ONE atomic script (no read-modify-write from Python), so
concurrent gateway instances never lose an update. The scripts live with their concern, one module
each: `admission.redis_rate_limit` (token buckets), `admission.redis_leases` (bulkheads, replica slot
credits), `gateway.proxy.stores.idempotency_redis` and `gateway.fleet.instance_membership`; the
composition root (`gateway.composition`) builds the one backend and closes it last.

Time: scripts read the Redis server's `TIME`. Gateway instances cannot share their own clocks:
monotonic clocks have per-process origins and wall clocks drift between hosts, so a refill or lease
expiry computed from caller time would disagree between instances. Redis's clock is the one clock all
instances see; Redis ≥ 5 replicates script effects, so `TIME` inside a writing script is allowed.
`script_time` (a `Clock`) replaces it with caller time — for tests with a `FakeClock` only.

Failure behaviour (`state.on_error`): a call that cannot reach Redis (connection refused or reset,
socket timeout, read-only replica, overall deadline of 4 x `timeout_s`) is answered by the
`FailureMode`, counted and logged (`core.state_outage`). Recovery needs nothing: redis-py reconnects
on the next call and `EVALSHA` falls back to loading the script into a restarted server. Other Redis
errors (a script bug) are raised, not hidden. The client is built with short socket timeouts (default
0.25 s) and no client-side retries: admission must answer fast, and the failure policy is the retry.

Waiting: `subscribe(operation, channel)` is the one non-script call — a pub/sub subscription that a
script's `PUBLISH` wakes (scripts cannot block). It is confirmed by the server before it is handed out, so
a message published after `subscribe` returns is never missed; each `wait(timeout_s)` overrides the short
socket timeout for that read only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.clock import Clock, SystemClock
from core.state_outage import DEFAULT_LOG_INTERVAL_S, FailureMode, OutageRecord, RedisOperation

DEFAULT_TIMEOUT_S = 0.25
DEFAULT_KEY_PREFIX = "llm-gateway:"
_DEADLINE_ROUND_TRIPS = 4  # connect + EVALSHA + SCRIPT LOAD + EVALSHA after a server restart
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)

LUA_PRELUDE = """
local function now_s()
  if ARGV[1] ~= '' then return tonumber(ARGV[1]) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function fmt(x) return string.format('%.6f', x) end
"""


def outlasted_periods(timeout_s: float, periods_s: Mapping[str, float]) -> list[str]:
    """The names of the renewal periods in `periods_s` that one slow call could outlast: a call may run
    up to its deadline, `_DEADLINE_ROUND_TRIPS` (4) × `timeout_s`, before `on_error` answers, so
    renewals fall behind their period; what they renew (a slot credit, a claim, a heartbeat, each
    living 3 periods) lapses while still held once they fall 2 periods behind. An early warning."""
    deadline_s = timeout_s * _DEADLINE_ROUND_TRIPS
    return [name for name, period_s in periods_s.items() if deadline_s >= period_s]


def make_redis_client(url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Redis:
    """A client for `url` with short connect/read timeouts and no client-side retries."""
    return Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


class RedisBackend:
    """A Redis client plus the `FailureMode` policy, error counting and throttled logging.

    `clock` (default `SystemClock`) times the log interval and the outage age locally; `script_time`
    (default None = Redis server `TIME`) is the time scripts compute with — set it only in tests.
    `on_error_callback(operation)` runs on every unreachable-Redis failure (wire a metric to it).
    """

    def __init__(
        self,
        client: Redis,
        *,
        on_error: FailureMode = FailureMode.FAIL_OPEN,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        log_interval_s: float = DEFAULT_LOG_INTERVAL_S,
        clock: Clock | None = None,
        script_time: Clock | None = None,
        on_error_callback: Callable[[RedisOperation], None] | None = None,
    ) -> None:
        self._client = client
        self._on_error = on_error
        self._key_prefix = key_prefix
        self._timeout_s = timeout_s
        self._deadline_s = timeout_s * _DEADLINE_ROUND_TRIPS
        self._script_time = script_time
        self._outages = OutageRecord(
            on_error,
            clock or SystemClock(),
            log_interval_s=log_interval_s,
            on_error_callback=on_error_callback,
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        on_error: FailureMode = FailureMode.FAIL_OPEN,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        log_interval_s: float = DEFAULT_LOG_INTERVAL_S,
        on_error_callback: Callable[[RedisOperation], None] | None = None,
    ) -> RedisBackend:
        """The production constructor: a `make_redis_client(url, timeout_s)` client, Redis server time."""
        return cls(
            make_redis_client(url, timeout_s),
            on_error=on_error,
            key_prefix=key_prefix,
            timeout_s=timeout_s,
            log_interval_s=log_interval_s,
            on_error_callback=on_error_callback,
        )

    @property
    def on_error(self) -> FailureMode:
        """What calls answer while Redis is unreachable."""
        return self._on_error

    @property
    def fail_open(self) -> bool:
        """True when an unreachable Redis means allow."""
        return self._on_error is FailureMode.FAIL_OPEN

    @property
    def timeout_s(self) -> float:
        """Per-call socket timeout; a call gives up after 4 x this in total."""
        return self._timeout_s

    @property
    def errors_total(self) -> int:
        """Calls that could not reach Redis since start (a counter for metrics)."""
        return self._outages.errors_total

    @property
    def available(self) -> bool:
        """False from a failed call until the next successful one."""
        return self._outages.available

    def outage_retry_after_s(self) -> float:
        """Retry-After for a fail-closed refusal: how long the outage has lasted so far (≥ 1 s), the
        best estimate of its remaining duration when nothing else is known."""
        return self._outages.retry_after_s()

    def key(self, *parts: str) -> str:
        """`key_prefix` + parts joined by ':'."""
        return self._key_prefix + ":".join(parts)

    def register(self, source: str) -> AsyncScript:
        """Register a Lua script (sent as EVALSHA, loaded on NOSCRIPT)."""
        return self._client.register_script(source)

    def now_arg(self) -> str:
        """ARGV[1] of every script: '' (use Redis `TIME`) or the injected `script_time`."""
        return "" if self._script_time is None else f"{self._script_time.now_s():.6f}"

    async def run(
        self, operation: RedisOperation, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        """Run `script`; its reply, or None when Redis is unreachable (counted and logged).

        Scripts never return nil, so None always means "apply the FailureMode".
        """
        try:
            async with asyncio.timeout(self._deadline_s):
                reply = await script(keys=list(keys), args=[self.now_arg(), *args])
        except _UNREACHABLE as exc:
            self._outages.failed(operation, exc)
            return None
        self._outages.succeeded()
        return reply

    @contextlib.asynccontextmanager
    async def subscribe(
        self, operation: RedisOperation, channel: str
    ) -> AsyncIterator[ChannelSubscription | None]:
        """A server-confirmed subscription to `channel` (its own connection, closed on exit), or None
        when Redis is unreachable (counted and logged like `run`)."""
        pubsub = self._client.pubsub()
        try:
            yield await self._confirm_subscription(operation, channel, pubsub)
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # untyped before redis-py 8

    async def _confirm_subscription(
        self, operation: RedisOperation, channel: str, pubsub: PubSub
    ) -> ChannelSubscription | None:
        try:
            async with asyncio.timeout(self._deadline_s):
                await pubsub.subscribe(channel)
                confirmed = await pubsub.get_message(timeout=self._deadline_s)
            if confirmed is None or confirmed["type"] != "subscribe":
                raise RedisTimeoutError(f"SUBSCRIBE {channel} was not confirmed")
        except _UNREACHABLE as exc:
            self._outages.failed(operation, exc)
            return None
        self._outages.succeeded()

        def unreachable(exc: BaseException) -> None:
            self._outages.failed(operation, exc)

        return ChannelSubscription(pubsub, self._deadline_s, unreachable)

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self._client.aclose()


class ChannelSubscription:
    """One confirmed pub/sub subscription (see `RedisBackend.subscribe`)."""

    def __init__(
        self, pubsub: PubSub, deadline_s: float, on_unreachable: Callable[[BaseException], None]
    ) -> None:
        self._pubsub = pubsub
        self._deadline_s = deadline_s
        self._on_unreachable = on_unreachable

    async def wait(self, timeout_s: float) -> bool:
        """Wait until a message arrives or `timeout_s` passes (callers re-check either way); False when
        Redis became unreachable meanwhile (counted and logged)."""
        try:
            async with asyncio.timeout(timeout_s + self._deadline_s):
                await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout_s)
        except _UNREACHABLE as exc:
            self._on_unreachable(exc)
            return False
        return True
