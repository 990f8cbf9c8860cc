"""The legs of an aggregated pool (`gateway.proxy.legs`): one replica prefills and decodes, so a try is
one leg — send the request (or its continuation) to the ticket's SERVE slot and relay the answer.

A failure gives its slot back (the next try routes again with that replica excluded); a stale
keep-alive connection keeps it (the same replica once more, over a new connection).
"""

from __future__ import annotations

from collections.abc import Mapping

from admission.outcomes import AdmissionRefused
from admission.ticket import AdmissionRequest, SlotRole, Ticket
from gateway.proxy.admit import PoolAdmission
from gateway.proxy.context import RequestContext
from gateway.proxy.legs import LegFailure, LegRunner, Try
from gateway.upstream.slot import Slot
from router.types import Decision

_SERVE = (SlotRole.SERVE,)


class OneReplica:
    """An aggregated pool's legs (module docstring)."""

    def __init__(self, admission: PoolAdmission, leg: LegRunner) -> None:
        self._admission = admission
        self._leg = leg
        self._sets = {SlotRole.SERVE: admission}

    @property
    def sets(self) -> Mapping[SlotRole, PoolAdmission]:
        return self._sets

    def check(self, ctx: RequestContext) -> None:
        """Every endpoint the pool serves is served this way."""

    async def admit(self, request: AdmissionRequest) -> Ticket[Slot]:
        return await self._admission.admit(request)

    def queue_depth(self) -> int:
        return self._admission.queue_depth()

    def no_replica(self, role: SlotRole, ctx: RequestContext) -> AdmissionRefused:
        return self._admission.no_replica(ctx.routing.model)

    def decision(self, ticket: Ticket[Slot]) -> Decision:
        slot = ticket.slot(SlotRole.SERVE)
        assert slot is not None
        return slot.decision

    def redo(self, failure: LegFailure) -> tuple[SlotRole, ...]:
        return () if failure.stale else _SERVE

    async def run(self, t: Try) -> LegFailure | None:
        slot = t.ticket.slot(SlotRole.SERVE)
        assert slot is not None
        return await self._leg.relayed(
            t.ctx, t, self._leg.attempt(slot, t.number), SlotRole.SERVE, self._admission.pool
        )
