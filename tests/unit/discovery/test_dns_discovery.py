from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Sequence

import pytest

from core.clock import FakeClock
from gateway.config.discovery_settings import DnsReplicas
from gateway.upstream.discovery.dns import DnsDiscovery, GetaddrinfoResolver
from gateway.upstream.discovery.types import ReplicaSet
from tests.unit.discovery.conftest import Collector


class StubResolver:
    """Answers what the test set; raises when `answer` is an exception; can hang."""

    def __init__(self, answer: Sequence[str] | BaseException = ()) -> None:
        self.answer: Sequence[str] | BaseException = answer
        self.hang = False
        self.calls: list[tuple[str, int]] = []

    async def resolve(self, name: str, port: int) -> Sequence[str]:
        self.calls.append((name, port))
        if self.hang:
            await asyncio.sleep(3600)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return list(self.answer)


def make(
    resolver: StubResolver, clock: FakeClock, resolve_timeout_s: float = 5.0
) -> tuple[DnsDiscovery, Collector]:
    seen = Collector()
    discovery = DnsDiscovery(
        "vllm.ml.svc",
        8000,
        5.0,
        resolver,
        on_change=seen,
        clock=clock,
        drain_grace_s=30.0,
        resolve_timeout_s=resolve_timeout_s,
    )
    return discovery, seen


U1, U2, U3 = "http://127.0.0.21:8000", "http://127.0.0.22:8000", "http://127.0.0.23:8000"


async def test_additions_and_removals_become_draining_then_forgotten() -> None:
    resolver, clock = StubResolver(["127.0.0.21", "127.0.0.22"]), FakeClock(1000.0)
    discovery, seen = make(resolver, clock)

    assert await discovery.refresh_once()
    assert seen.sets == [ReplicaSet.of(ready=[U1, U2])]
    assert resolver.calls == [("vllm.ml.svc", 8000)]

    resolver.answer = ["127.0.0.21", "127.0.0.22", "127.0.0.23"]
    await discovery.refresh_once()
    assert seen.sets[-1] == ReplicaSet.of(ready=[U1, U2, U3])

    resolver.answer = ["127.0.0.21", "127.0.0.23"]
    clock.advance(5)
    await discovery.refresh_once()
    assert seen.sets[-1] == ReplicaSet.of(ready=[U1, U3], draining=[U2])

    clock.advance(29)  # still inside the grace: nothing changes, nothing is emitted
    await discovery.refresh_once()
    assert len(seen.sets) == 3

    clock.advance(1)  # grace over: forgotten (the registry drops it once its in-flight count is 0)
    await discovery.refresh_once()
    assert seen.sets[-1] == ReplicaSet.of(ready=[U1, U3])
    assert len(seen.sets) == 4


async def test_a_returning_address_is_ready_again() -> None:
    resolver, clock = StubResolver(["127.0.0.21", "127.0.0.22"]), FakeClock(1000.0)
    discovery, seen = make(resolver, clock)
    await discovery.refresh_once()
    resolver.answer = ["127.0.0.21"]
    await discovery.refresh_once()
    assert seen.sets[-1] == ReplicaSet.of(ready=[U1], draining=[U2])
    resolver.answer = ["127.0.0.21", "127.0.0.22"]
    clock.advance(10)
    await discovery.refresh_once()
    assert seen.sets[-1] == ReplicaSet.of(ready=[U1, U2])
    resolver.answer = ["127.0.0.21"]
    clock.advance(10)
    await discovery.refresh_once()  # its grace starts afresh
    clock.advance(29)
    await discovery.refresh_once()
    assert seen.sets[-1] == ReplicaSet.of(ready=[U1], draining=[U2])


@pytest.mark.parametrize(
    "failure",
    [
        socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
        socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
        OSError("network down"),
        [],  # an empty answer
    ],
)
async def test_errors_keep_the_last_good_set_and_are_counted(failure: object) -> None:
    resolver, clock = StubResolver(["127.0.0.21"]), FakeClock(1000.0)
    discovery, seen = make(resolver, clock)
    await discovery.refresh_once()
    resolver.answer = failure  # type: ignore[assignment]
    assert not await discovery.refresh_once()
    assert not await discovery.refresh_once()
    assert seen.sets == [ReplicaSet.of(ready=[U1])] and discovery.current == ReplicaSet.of(ready=[U1])
    assert discovery.stats.errors_total == 2 and discovery.stats.consecutive_errors == 2
    assert discovery.stats.last_error
    resolver.answer = ["127.0.0.22"]
    assert await discovery.refresh_once()
    assert discovery.stats.consecutive_errors == 0 and discovery.stats.errors_total == 2
    assert seen.sets[-1] == ReplicaSet.of(ready=[U2], draining=[U1])


async def test_a_hanging_resolver_times_out_as_an_error() -> None:
    resolver, clock = StubResolver(["127.0.0.21"]), FakeClock(1000.0)
    discovery, seen = make(resolver, clock, resolve_timeout_s=0.05)
    await discovery.refresh_once()
    resolver.hang = True
    assert not await discovery.refresh_once()
    assert "TimeoutError" in (discovery.stats.last_error or "")
    assert seen.sets == [ReplicaSet.of(ready=[U1])]


async def test_run_refreshes_periodically_and_formats_ipv6() -> None:
    resolver = StubResolver(["fd00::5", "127.0.0.21"])
    seen = Collector()
    settings = DnsReplicas(name="vllm", port=8001, refresh_s=0.01, scheme="https")
    discovery = DnsDiscovery.from_settings(settings, seen, resolver)
    task = asyncio.create_task(discovery.run())
    try:
        assert await seen.next() == ReplicaSet.of(ready=["https://[fd00::5]:8001", "https://127.0.0.21:8001"])
        async with asyncio.timeout(2):
            while len(resolver.calls) < 3:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert len(seen.sets) == 1


async def test_default_resolver_uses_getaddrinfo() -> None:
    addresses = await GetaddrinfoResolver().resolve("127.0.0.1", 80)
    assert addresses == ["127.0.0.1"]
