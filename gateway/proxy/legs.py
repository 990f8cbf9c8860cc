"""A pool's legs: how one try of a request runs on the replicas its ticket holds — the only part of
the serve path that differs between an aggregated and a disaggregated pool. The composition root picks
each pool's legs (`gateway.composition`); the skeleton (`gateway.proxy.serving`, `gateway.proxy.tries`)
is the same for every pool.

    aggregated      `gateway.proxy.aggregated_legs.OneReplica`: role SERVE; one leg — send, relay
    disaggregated   `gateway.proxy.disagg.pair.PrefillDecode`: roles PREFILL and DECODE; a prefill leg,
                    then the decode leg relayed (vLLM `kv_transfer_params`), or both legs at once
                    (SGLang bootstrap)

What the skeleton asks of the legs (`Legs`): the set (`PoolAdmission`) behind each role (`sets`), the
pool's admission (`admit`: one ticket holding a slot in every role), the `no_replica` refusal of a role,
the decision the client's headers name, one try (`run`: None when the client got its answer, else the
failed leg, `LegFailure`), and which slots a failure gives back (`redo`). What the skeleton does for
every pool: containment and attribution per set, retries, continuation after the first byte (a new try
with the continuation's body, on the roles `redo` gave back), the stale-connection rule, preemption
cut-over (a leg cut by a notice fails like any other, uncharged), autoscaling signals and the release.

`LegRunner` is what the legs share: the relayed leg (send, relay, teach the slot, count it served), each
leg under the preemption notices (`gateway.proxy.preemption.Preemption.running`), and a keep-alive
connection the engine had closed before answering (`StaleConnection`) reported as a stale
`LegFailure` — the skeleton tries once more, free, and a second one is the replica's broken stream.
The legs tell the event port (`gateway.observability.events`) each leg's start, relay and end, and
each prefill leg that answered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from admission.outcomes import AdmissionRefused
from admission.ticket import AdmissionRequest, SlotRole, Ticket
from core.clock import Clock
from gateway.base.errors import UpstreamError, UpstreamProtocolError
from gateway.observability.events import ServeEvents
from gateway.proxy.admit import PoolAdmission
from gateway.proxy.attempt import Attempt
from gateway.proxy.containment import Containment
from gateway.proxy.context import RequestContext
from gateway.proxy.preemption import Preemption
from gateway.proxy.relay import StreamRelay, relay
from gateway.proxy.reply import Reply
from gateway.proxy.send import StaleConnection, UpstreamClient
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.slot import Slot
from router.types import Decision


@dataclass(slots=True)
class Try:
    """One try of a request: what its legs share."""

    ctx: RequestContext
    """What goes upstream: the request, or after a break its continuation (same record, same pool)."""
    reply: Reply
    ticket: Ticket[Slot]
    stream: StreamRelay
    """The request's one stream relay (it keeps the transcript a continuation is built from)."""
    number: int
    """1 for the first try, 2 for the next, …"""


@dataclass(frozen=True, slots=True)
class LegFailure:
    """The leg that failed a try: its role, its error, the slot it ran on."""

    role: SlotRole
    error: UpstreamError
    slot: Slot
    preempted: bool = False
    """Cut by a preemption notice: nobody's failure (not judged, not charged)."""
    stale: bool = False
    """The engine had closed the keep-alive connection before answering (nothing was generated)."""


class Legs(Protocol):
    """A pool's legs (module docstring)."""

    @property
    def sets(self) -> Mapping[SlotRole, PoolAdmission]:
        """The set (its pool and its claims) behind each role the pool's requests hold."""
        ...

    def check(self, ctx: RequestContext) -> None:
        """Refuse (a `GatewayError`) a request the pool cannot serve this way, before admission."""
        ...

    async def admit(self, request: AdmissionRequest) -> Ticket[Slot]:
        """A ticket holding a slot in every role of `sets`, or the refusal as its gateway error."""
        ...

    def queue_depth(self) -> int:
        """Requests of the pool waiting in admission now."""
        ...

    def no_replica(self, role: SlotRole, ctx: RequestContext) -> AdmissionRefused:
        """The `no_replica` refusal when `role`'s set has no eligible replica for a retry."""
        ...

    def decision(self, ticket: Ticket[Slot]) -> Decision:
        """The routing decision the client's headers name, for the slots `ticket` holds."""
        ...

    def redo(self, failure: LegFailure) -> tuple[SlotRole, ...]:
        """The roles whose slots `failure` gives back (claimed again, elsewhere for the failed one)."""
        ...

    async def run(self, t: Try) -> LegFailure | None:
        """One try on the slots `t.ticket` holds: None when the client got its answer."""
        ...


class LegRunner:
    """What every pool's legs share (module docstring); one per app."""

    def __init__(
        self,
        *,
        upstream: UpstreamClient,
        registry: ReplicaRegistry,
        preemption: Preemption,
        containment: Containment,
        events: ServeEvents,
        clock: Clock,
    ) -> None:
        self.preemption = preemption
        self.registry = registry
        self.events = events
        self._upstream = upstream
        self._containment = containment
        self._clock = clock

    def attempt(self, slot: Slot, number: int, started_s: float | None = None) -> Attempt:
        """A leg's attempt on `slot`; its deadlines run from `started_s` (the clock's) or now."""
        return Attempt(slot, number, self._clock, started_s)

    def now_s(self) -> float:
        return self._clock.now_s()

    async def send(
        self, ctx: RequestContext, attempt: Attempt, *, resend: bool = False
    ) -> aiohttp.ClientResponse:
        """`UpstreamClient.send`; after a stale keep-alive connection, once more over a new one when
        `resend` (nothing of the leg can have been consumed), else the `StaleConnection` is raised."""
        if resend:
            try:
                return await self._upstream.send(ctx, attempt)
            except StaleConnection:
                pass
        return await self._upstream.send(ctx, attempt)

    async def relayed(
        self, ctx: RequestContext, t: Try, attempt: Attempt, role: SlotRole, pool: Pool
    ) -> LegFailure | None:
        """The leg whose answer goes to the client (`ctx` carries its body): send, relay through the
        request's stream relay; the attempt is closed whatever happens (an unfinished upstream response
        is aborted). `pool` is the set of `attempt`'s slot."""
        events = self.events
        slot = attempt.slot
        events.attempt_started(ctx, t.number, slot)
        try:
            with self.preemption.running(attempt):
                attempt.response = await self.send(ctx, attempt)
                self.registry.record_success(slot.replica)
                events.relay_started(ctx)
                await relay(ctx, t.reply, attempt, t.stream)
        except StaleConnection as stale:
            events.attempt_ended(ctx, stale)
            return stale_failure(role, attempt)
        except UpstreamError as error:
            events.attempt_ended(ctx, error)
            return LegFailure(role, error, slot, preempted=attempt.preempted)
        finally:
            attempt.close()
        completion = (t.reply.usage or {}).get("completion_tokens")
        if isinstance(completion, int):
            slot.finished(completion)  # the replica's latency model learns its TPOT
        self.served(pool, slot)
        events.attempt_ended(ctx, None)
        return None

    def served(self, pool: Pool, slot: Slot) -> None:
        """`slot`'s replica (of set `pool`) delivered its leg: it serves others, and got its first token
        in time (attribution's evidence)."""
        self.registry.record_served(slot.replica)
        self._containment.attribution(pool.model).first_token_served(slot.replica)


def stale_failure(role: SlotRole, attempt: Attempt) -> LegFailure:
    """The failure of a leg whose keep-alive connection the engine had closed before answering."""
    rid = attempt.slot.replica.replica_id
    error = UpstreamProtocolError(f"replica {rid} closed the connection before answering", replica_id=rid)
    return LegFailure(role, error, attempt.slot, preempted=attempt.preempted, stale=True)
