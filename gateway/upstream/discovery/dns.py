"""DNS discovery: resolve a name (typically a headless Service) every `refresh_s` seconds.

Every A/AAAA address is one replica `scheme://address:port`. An address that leaves the answer is
announced as `draining` for `drain_grace_s` (in-flight requests finish; a resolver that rotates a
partial answer does not churn the ring), then forgotten; the registry drops a forgotten replica once
its in-flight count is zero (`membership.plan_membership`). An address that comes back is `ready` again.

A failed resolution (timeout, SERVFAIL, NXDOMAIN, an empty answer) keeps the last good set, is counted
in `stats`, and emits nothing. NXDOMAIN is treated as an error on purpose: a DNS fault must not drain a
healthy fleet, and replicas that really are gone are caught by the registry's passive health checks.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from core.clock import Clock, SystemClock
from gateway.config.discovery_settings import DnsReplicas
from gateway.upstream.discovery.types import Emitter, OnChange, ReplicaSet, ReplicaState, format_url

logger = logging.getLogger(__name__)


class ResolutionError(OSError):
    """The name resolved to no usable address."""


class Resolver(Protocol):
    async def resolve(self, name: str, port: int) -> Sequence[str]:
        """The addresses (IPv4/IPv6 literals) `name` resolves to; raises `OSError` on failure."""
        ...


class GetaddrinfoResolver:
    """The system resolver through the event loop's `getaddrinfo` (a thread; honours /etc/resolv.conf)."""

    async def resolve(self, name: str, port: int) -> Sequence[str]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        return sorted({str(info[4][0]) for info in infos})


@dataclass(slots=True)
class DiscoveryStats:
    refreshes_total: int = 0
    errors_total: int = 0
    consecutive_errors: int = 0
    last_error: str | None = None
    last_success_s: float | None = None


class DnsDiscovery:
    """Periodic A/AAAA resolution → `ReplicaSet` events (module docstring)."""

    def __init__(
        self,
        name: str,
        port: int,
        refresh_s: float,
        resolver: Resolver | None = None,
        *,
        on_change: OnChange,
        scheme: str = "http",
        drain_grace_s: float = 30.0,
        resolve_timeout_s: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self.port = port
        self.refresh_s = refresh_s
        self.scheme = scheme
        self.drain_grace_s = drain_grace_s
        self.resolve_timeout_s = resolve_timeout_s
        self._resolver: Resolver = resolver or GetaddrinfoResolver()
        self._clock = clock or SystemClock()
        self._emitter = Emitter(on_change)
        self._gone_since_s: dict[str, float] = {}
        self.stats = DiscoveryStats()

    @classmethod
    def from_settings(
        cls, settings: DnsReplicas, on_change: OnChange, resolver: Resolver | None = None
    ) -> DnsDiscovery:
        return cls(
            settings.name,
            settings.port,
            settings.refresh_s,
            resolver,
            on_change=on_change,
            scheme=settings.scheme,
            drain_grace_s=settings.drain_grace_s,
        )

    @property
    def current(self) -> ReplicaSet | None:
        return self._emitter.last

    async def run(self) -> None:
        """Refresh every `refresh_s` until cancelled."""
        while True:
            await self.refresh_once()
            await asyncio.sleep(self.refresh_s)

    async def refresh_once(self) -> bool:
        """Resolve once and emit the new set if it changed; False when resolution failed."""
        self.stats.refreshes_total += 1
        try:
            async with asyncio.timeout(self.resolve_timeout_s):
                addresses = await self._resolver.resolve(self.name, self.port)
            if not addresses:
                raise ResolutionError(f"{self.name} resolved to no address")
        except (OSError, TimeoutError) as exc:
            self._record_error(exc)
            return False
        if self.stats.consecutive_errors:
            errors = self.stats.consecutive_errors
            logger.info("dns discovery %s: resolving again after %d errors", self.name, errors)
        self.stats.consecutive_errors = 0
        self.stats.last_success_s = self._clock.now_s()
        self._emitter.emit(self._next_set(addresses))
        return True

    def _record_error(self, exc: BaseException) -> None:
        self.stats.errors_total += 1
        self.stats.consecutive_errors += 1
        self.stats.last_error = f"{type(exc).__name__}: {exc}"
        if self.stats.consecutive_errors == 1:
            message = self.stats.last_error
            logger.warning("dns discovery %s: %s; keeping the last good set", self.name, message)

    def _next_set(self, addresses: Sequence[str]) -> ReplicaSet:
        now_s = self._clock.now_s()
        ready = {format_url(self.scheme, address, self.port) for address in addresses}
        previous = self._emitter.last or ReplicaSet()
        for url in previous:
            if url not in ready:
                self._gone_since_s.setdefault(url, now_s)
        for url in ready:
            self._gone_since_s.pop(url, None)
        states = {url: ReplicaState.READY for url in ready}
        for url, since_s in list(self._gone_since_s.items()):
            if now_s - since_s >= self.drain_grace_s:
                del self._gone_since_s[url]
            else:
                states[url] = ReplicaState.DRAINING
        return ReplicaSet(states)
