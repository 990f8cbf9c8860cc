"""A `Slot`: one request's place on one replica, with the routing decision that chose it.

Taking a slot (`ReplicaRegistry.claim`) counts the request on the replica at once — in-flight
requests and estimated tokens (what routing reads), the breaker's in-flight count, the `inflight`
gauge — and `release()` undoes exactly that, once (idempotent). The admission `Ticket` is the only
holder of a slot (`admission.ticket`): a retry swaps the slot inside the ticket, and the ticket's
release releases it on every path. Release is synchronous and never runs admission in place: the
registry tells its release listeners, and the admission pumps they wake are scheduled (`call_soon`).
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.metrics import GatewayMetrics
from gateway.upstream.replica import Replica
from router.types import Decision


class Slot:
    """One request's claim on `replica`, chosen by `decision` (see the module docstring)."""

    __slots__ = ("_metrics", "_on_release", "_released", "decision", "replica", "tokens")

    def __init__(
        self,
        replica: Replica,
        decision: Decision,
        tokens: int,
        metrics: GatewayMetrics,
        on_release: Callable[[Replica], None],
    ) -> None:
        self.replica = replica
        self.decision = decision
        self.tokens = tokens
        self._metrics = metrics
        self._on_release = on_release
        self._released = False
        replica.inflight_requests += 1
        replica.inflight_tokens += tokens
        replica.breaker.on_dispatch()
        metrics.inflight.labels(replica.replica_id).inc()

    @property
    def released(self) -> bool:
        """True once `release()` ran."""
        return self._released

    def release(self) -> None:
        """Give the place back (idempotent); the registry then tells its release listeners."""
        if self._released:
            return
        self._released = True
        self.replica.inflight_requests -= 1
        self.replica.inflight_tokens -= self.tokens
        self.replica.breaker.on_release()
        self._metrics.inflight.labels(self.replica.replica_id).dec()
        self._on_release(self.replica)
