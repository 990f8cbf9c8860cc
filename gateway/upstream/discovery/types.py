"""Membership events: what a discovery source tells the registry.

A source emits a whole `ReplicaSet` (replica URL → `ReplicaState`) each time membership changes, never a
delta, and never the same set twice in a row: one event is one ring rebuild. The contract the registry
keeps (see `membership.plan_membership`):

- `ready`    — eligible for new requests;
- `draining` — no new requests; in-flight requests finish (an endpoint that is terminating, or that
  vanished from DNS and is still inside its grace period);
- absent     — the source no longer knows it: the registry drains it and drops it once its in-flight
  count is zero (at once when it is already zero). A replica is never dropped mid-stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Protocol


class ReplicaState(StrEnum):
    READY = "ready"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True, eq=False)
class ReplicaSet(Mapping[str, ReplicaState]):
    """An immutable mapping replica URL → state; equal when the mappings are equal."""

    _states: Mapping[str, ReplicaState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_states", MappingProxyType(dict(self._states)))

    @classmethod
    def of(
        cls, ready: tuple[str, ...] | list[str] = (), draining: tuple[str, ...] | list[str] = ()
    ) -> ReplicaSet:
        states = {url: ReplicaState.DRAINING for url in draining}
        states.update({url: ReplicaState.READY for url in ready})
        return cls(states)

    def __getitem__(self, url: str) -> ReplicaState:
        return self._states[url]

    def __iter__(self) -> Iterator[str]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ReplicaSet):
            return dict(self._states) == dict(other._states)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._states.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{url}: {state.value}" for url, state in sorted(self._states.items()))
        return f"ReplicaSet({{{inner}}})"

    def urls(self, state: ReplicaState) -> frozenset[str]:
        return frozenset(url for url, s in self._states.items() if s is state)

    @property
    def ready(self) -> frozenset[str]:
        return self.urls(ReplicaState.READY)

    @property
    def draining(self) -> frozenset[str]:
        return self.urls(ReplicaState.DRAINING)

    def all_draining(self) -> ReplicaSet:
        """The same members, none of them eligible for new requests."""
        return ReplicaSet(dict.fromkeys(self._states, ReplicaState.DRAINING))


OnChange = Callable[[ReplicaSet], None]
"""Called synchronously on the event loop with the new complete set. It must not block; the registry
applies the change (one ring rebuild) and returns. An exception propagates and ends the source's task."""


class DiscoverySource(Protocol):
    """A background membership source: `run()` until cancelled; `current` is the last emitted set."""

    @property
    def current(self) -> ReplicaSet | None: ...

    async def run(self) -> None: ...


class Emitter:
    """Deduplicates consecutive equal sets so that one emitted event always means one real change."""

    __slots__ = ("_last", "_on_change", "emitted_total")

    def __init__(self, on_change: OnChange) -> None:
        self._on_change = on_change
        self._last: ReplicaSet | None = None
        self.emitted_total = 0

    @property
    def last(self) -> ReplicaSet | None:
        return self._last

    def emit(self, replicas: ReplicaSet) -> bool:
        """Forward `replicas` when it differs from the last emitted set; True when it was forwarded."""
        if replicas == self._last:
            return False
        self._last = replicas
        self.emitted_total += 1
        self._on_change(replicas)
        return True


def format_url(scheme: str, host: str, port: int) -> str:
    """`scheme://host:port`, with IPv6 literals bracketed."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"
