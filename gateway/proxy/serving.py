"""Serve one request whose context is built, the same way for every pool: admit it, try its pool's
legs until the client has its answer, release.

    legs    = the pool's (`gateway.proxy.legs`, picked by the composition root): aggregated, one
              replica (role SERVE); disaggregated, a prefill then a decode replica (PREFILL, DECODE)
    arrive  = `Containment.arrive`: 422 when quarantined, routed away from where the request failed
    admit   = the legs' admission: a ticket holding a slot in every role (or 401/429/503)
    tries   = `gateway.proxy.tries`: claim, run the legs, judge failures, retry before the first byte,
              continue after it
    finally = the ticket released (every slot, forecast key, tenant lease), the tenant's token bucket
              reconciled with the actual usage

Each step is told once to the event port (`gateway.observability.events.ServeEvents`): arrived,
admitted or refused, each leg's start and end, retries, continuations, charges, served, failed. Its
subscribers are the metrics (`gateway.proxy.account`), the request's spans and access-log line
(`gateway.observability.record_events`, when tracing or the access log is on) and the autoscaling
signal (`gateway.fleet.autoscaling.AutoscaleSink`: fed per set of the pool, when a pool has one).
"""

from __future__ import annotations

from collections.abc import Mapping

from admission.ticket import AdmissionRequest
from gateway.api.asgi_io import Scope
from gateway.base.errors import GatewayError
from gateway.observability.events import ServeEvents
from gateway.observability.observer import RequestObserver
from gateway.observability.request_record import RequestRecord
from gateway.proxy.containment import Containment
from gateway.proxy.context import RequestContext
from gateway.proxy.legs import Legs
from gateway.proxy.reply import Reply
from gateway.proxy.tries import TryLoop


class RequestServer:
    """The serve path after the edge (module docstring); one per app."""

    def __init__(
        self,
        *,
        legs: Mapping[str, Legs],
        tries: TryLoop,
        containment: Containment,
        events: ServeEvents,
        observer: RequestObserver,
    ) -> None:
        """`legs`: every client-facing pool's, by model."""
        self._legs = legs
        self._tries = tries
        self._containment = containment
        self._events = events
        self._observer = observer

    def observe(self, scope: Scope, request_id: str, endpoint: str) -> RequestRecord:
        """The record of a request to `endpoint` that just arrived (its server span starts now when
        tracing)."""
        return self._observer.begin(scope, request_id, endpoint)

    async def serve(self, ctx: RequestContext, reply: Reply) -> None:
        """Admit, try, relay; everything taken is released before this returns or raises."""
        try:
            await self._serve(ctx, reply)
        except GatewayError as error:
            self._events.failed(ctx, error)
            raise

    async def _serve(self, ctx: RequestContext, reply: Reply) -> None:
        legs = self._legs[ctx.model]
        legs.check(ctx)
        sets = {role: side.pool for role, side in legs.sets.items()}
        ctx, failures = self._containment.arrive(ctx, sets)  # 422 when quarantined; routed away
        events = self._events
        events.arrived(ctx, legs.queue_depth)
        try:
            ticket = await legs.admit(
                AdmissionRequest(ctx.tenant, ctx.priority, ctx.routing.estimated_total_tokens, ctx.routing)
            )
        except GatewayError as refused:
            events.refused(ctx, refused)
            raise
        reply.queue_wait_s = ticket.queue_wait_s
        events.admitted(ctx, ticket.queue_wait_s)
        try:
            await self._tries.run(ctx, reply, ticket, legs, failures)
            events.served(ctx, reply)
        finally:
            await ticket.release()
            actual = _actual_tokens(reply)
            if actual is not None:
                await ticket.reconcile(actual)


def _actual_tokens(reply: Reply) -> int | None:
    usage = reply.usage or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        return prompt + completion
    return None
