"""Where each request fingerprint failed: the evidence that lets poison requests be told across requests.

A *sighting* is one failure of a request that ended unserved, on a replica that kept serving others,
with no load evidence (`gateway.proxy.failure_attribution`: the failures `RequestFailures.settle`
keeps in `sighted`): the replica, the failure kind and when. The containment
(`gateway.proxy.containment`) reads a fingerprint's sightings to quarantine it when a later identical
request fails the same way on another replica, to route identical requests away from replicas where it
failed, and to tell whether a replica's held failure repeats elsewhere.

Rules of the store: a sighting counts for the pool's `attribution.window_s` (60 s); a new sighting of
the same replica and kind replaces the older one; a fingerprint served anywhere is cleared (a request
that some replica answers is no poison request); at most `max_entries` fingerprints are kept (the
pool's `quarantine.max_entries`; beyond it the least recently sighted goes first).

Stores: `MemoryEvidence` (this instance) and, with `state.backend: redis`,
`gateway.proxy.stores.poison_evidence_redis.RedisEvidence` (every instance adds to and reads the same
evidence; reads use a local mirror synced every second).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from core.clock import Clock
from gateway.upstream.failure_kinds import FailureKind


@dataclass(frozen=True, slots=True)
class Sighting:
    """One failure of a fingerprint: on which replica, of which kind, when (this instance's clock)."""

    replica_id: str
    kind: FailureKind
    at_s: float


class EvidenceStore(Protocol):
    """A pool's sightings, by fingerprint (module docstring)."""

    @property
    def active(self) -> bool:
        """False when no fingerprint has a sighting (arrivals skip the fingerprint)."""
        ...

    def sightings(self, key: str) -> tuple[Sighting, ...]:
        """`key`'s sightings within the window (synchronous: a local read)."""
        ...

    async def add(self, key: str, replica_id: str, kind: FailureKind) -> tuple[Sighting, ...]:
        """Record a sighting; `key`'s sightings after it (every instance's, when shared and reachable)."""
        ...

    async def clear(self, key: str) -> None:
        """Forget `key`'s sightings (it was served)."""
        ...


class MemoryEvidence:
    """This instance's sightings: fingerprints in order of their last sighting, each for `window_s`."""

    def __init__(self, clock: Clock, window_s: float, max_entries: int) -> None:
        self._clock = clock
        self._window_s = window_s
        self._max_entries = max_entries
        self._by_key: OrderedDict[str, tuple[Sighting, ...]] = OrderedDict()

    @property
    def active(self) -> bool:
        self._expire()
        return bool(self._by_key)

    def sightings(self, key: str) -> tuple[Sighting, ...]:
        found = self._by_key.get(key)
        if found is None:
            return ()
        since_s = self._clock.now_s() - self._window_s
        live = tuple(s for s in found if s.at_s > since_s)
        if not live:
            del self._by_key[key]
        return live

    async def add(self, key: str, replica_id: str, kind: FailureKind) -> tuple[Sighting, ...]:
        return self.put(key, [Sighting(replica_id, kind, self._clock.now_s())])

    async def clear(self, key: str) -> None:
        self._by_key.pop(key, None)

    def put(self, key: str, new: Iterable[Sighting]) -> tuple[Sighting, ...]:
        """Add sightings to `key` (each replacing one of the same replica and kind); its sightings."""
        kept = {(s.replica_id, s.kind): s for s in self.sightings(key)}
        for sighting in new:
            kept[(sighting.replica_id, sighting.kind)] = sighting
        merged = tuple(sorted(kept.values(), key=lambda s: s.at_s))
        self._by_key[key] = merged
        self._by_key.move_to_end(key)
        while len(self._by_key) > self._max_entries:
            self._by_key.popitem(last=False)
        return merged

    def replace_all(self, entries: dict[str, list[Sighting]]) -> None:
        """Take `entries` as the whole evidence (a shared sync), the latest sighted last."""
        ordered = sorted(entries.items(), key=lambda item: max((s.at_s for s in item[1]), default=0.0))
        self._by_key = OrderedDict(
            (key, tuple(sorted(found, key=lambda s: s.at_s))) for key, found in ordered if found
        )
        while len(self._by_key) > self._max_entries:
            self._by_key.popitem(last=False)

    def _expire(self) -> None:
        """Drop fingerprints whose latest sighting is out of the window (the oldest come first)."""
        since_s = self._clock.now_s() - self._window_s
        while self._by_key:
            key, found = next(iter(self._by_key.items()))
            if found[-1].at_s > since_s:
                return
            del self._by_key[key]
