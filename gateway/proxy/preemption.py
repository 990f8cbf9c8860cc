"""Preemption notice: a replica that will go away at a known time stops taking requests at once, and
whatever still runs on it shortly before that time is moved to other replicas before it goes.

The case is a spot instance's reclaim notice (tens of seconds to two minutes) or a node drain with a
known grace period. `Preemption.notify(replica, deadline_s)` (the admin API's
`POST /admin/replicas/{id}/preempt`):

1. drains the replica (`ReplicaRegistry.set_draining`): routing sends it nothing new, in-flight
   requests go on;
2. at `deadline_s − margin_s` (default margin 2 s: time for a continuation's first token elsewhere)
   cuts every try still running on it: a stream that has started is continued on another replica
   (`gateway.proxy.continuation`, within `continuation.max_resumes` and the retry budget); a request
   that has sent nothing to its client yet is retried elsewhere like any failed try. Requests that
   finish before the cut are untouched. A cut is not the replica's failure: it is not charged to its
   breaker (`Attempt.preempted`).

A second notice for the same replica replaces the first one's deadline. `undrain` does not cancel a
notice (the instance is still going away); `aclose` (shutdown) cancels the pending cuts.

Kubernetes: an endpoint that turns terminating is drained by discovery; with the pool's
`terminating_grace_s` set (the pods' `terminationGracePeriodSeconds`) it is also a notice of that
deadline (`terminating`), so long streams move before the pod is killed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from gateway.proxy.attempt import Attempt
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.replica import Replica

DEFAULT_MARGIN_S = 2.0


class Preemption:
    """Live tries by replica, and the cuts scheduled by preemption notices (module docstring)."""

    def __init__(self, registry: ReplicaRegistry) -> None:
        self._registry = registry
        self._live: dict[int, set[Attempt]] = {}
        self._cuts: dict[int, asyncio.TimerHandle] = {}

    @contextmanager
    def running(self, attempt: Attempt) -> Iterator[None]:
        """Track `attempt` as running on its replica while the block runs."""
        key = id(attempt.slot.replica)
        live = self._live.setdefault(key, set())
        live.add(attempt)
        try:
            yield
        finally:
            live.discard(attempt)
            if not live:
                self._live.pop(key, None)

    def notify(
        self, replica: Replica, deadline_s: float, margin_s: float = DEFAULT_MARGIN_S, *, drain: bool = True
    ) -> float:
        """`replica` goes away in `deadline_s` seconds: drain it now (unless discovery already did:
        `drain=False`), cut its tries at the deadline − `margin_s` (at once when that has passed).
        Returns the seconds until the cut."""
        if drain:
            self._registry.set_draining(replica, True)
        key = id(replica)
        previous = self._cuts.pop(key, None)
        if previous is not None:
            previous.cancel()
        cut_in_s = max(0.0, deadline_s - margin_s)
        self._cuts[key] = asyncio.get_running_loop().call_later(cut_in_s, self._cut, key)
        return cut_in_s

    def terminating(self, pool: Pool, already: set[str]) -> None:
        """After a discovery event: each replica of `pool` that discovery now drains and did not before
        (`already`: ids draining before the event) gets a notice of `terminating_grace_s`, when set."""
        grace_s = pool.settings.terminating_grace_s
        if grace_s is None:
            return
        for replica in pool.replicas.values():
            if replica.discovery_draining and replica.replica_id not in already:
                self.notify(replica, grace_s, drain=False)

    def running_on(self, replica: Replica) -> int:
        """Tries running on `replica` now."""
        return len(self._live.get(id(replica), ()))

    async def aclose(self) -> None:
        """Cancel the pending cuts (shutdown)."""
        for handle in self._cuts.values():
            handle.cancel()
        self._cuts.clear()

    def _cut(self, key: int) -> None:
        self._cuts.pop(key, None)
        for attempt in list(self._live.get(key, ())):
            attempt.preempt()
