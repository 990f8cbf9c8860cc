"""The tries of one admitted request, the same for every pool: run the pool's legs (`gateway.proxy.legs`)
on the slots the ticket holds until the client has its answer or the request its final error.

    a try      : claim what the ticket lacks — each role on its set, the replicas that failed there
                 excluded (none eligible: the last failure, else `no_replica`) — then `legs.run`
    a failure  : a leg cut by a preemption notice is nobody's failure; any other is judged on its own
                 set (`gateway.proxy.containment`: attribution, quarantine across identical requests)
                 and its charges accounted; a poison request is answered 422 `request_quarantined`
      before the first byte : retried when the retry policy allows (`gateway.proxy.retry_policy`: a
                 retryable kind, attempts of that role left, not too large): the slots the legs give
                 back are claimed again elsewhere after a jittered backoff, one retry drawn from the
                 pool's budget once they are claimed (none left: the failure is final)
      after it : continued (`gateway.proxy.continuation`): the next try sends the continuation's body,
                 with no backoff and nothing drawn from the budget, at most `continuation.max_resumes`
                 times; a failure that cannot be continued ends the stream with its terminal error
    stale      : a keep-alive connection the engine had closed before answering is tried once more per
                 request, free (counted as a `stale_connection` retry); a second one is a broken stream
    the end    : every set's pending failures settled (`Containment.settle`) and charged

A try's failed leg is charged to its own set's replica (`upstream_failures_total{model}` is the set's
pool: `<model>/prefill` for a prefill replica): only a replica's own failures reach its breaker
(`ReplicaRegistry.record_failure`); an engine's 429/503 holds the replica out for its Retry-After.
Retries, continuations and charges are told to the event port (`gateway.observability.events`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace

from admission.ticket import SlotRole, Ticket
from gateway.base.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamIdleTimeout,
    UpstreamProtocolError,
    UpstreamTTFTTimeout,
    from_refusal,
)
from gateway.observability.events import ServeEvents
from gateway.proxy.containment import Containment
from gateway.proxy.context import RequestContext
from gateway.proxy.continuation import Splice, StreamTranscript, continuation_body
from gateway.proxy.failure_attribution import RequestFailures
from gateway.proxy.failure_charges import Charge, FailureCause
from gateway.proxy.legs import LegFailure, Legs, Try
from gateway.proxy.relay import StreamRelay
from gateway.proxy.reply import Reply
from gateway.proxy.retry_policy import RetryPolicy, failure_kind
from gateway.upstream.failure_kinds import FailureKind
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.slot import Slot

RESUMABLE_FAILURES = (UpstreamIdleTimeout, UpstreamProtocolError, UpstreamTTFTTimeout, UpstreamConnectError)
"""Failures after the first byte that a continuation on another replica repairs (the replica went
silent, broke off or truncated the stream; a continuation's own try stalled or could not connect)."""
STALE_CONNECTION = "stale_connection"


@dataclass(slots=True)
class _Progress:
    """One request's tries so far."""

    excluded: dict[SlotRole, set[str]]
    """By role: the replicas a retry or continuation of that role is not sent to."""
    attempts: dict[SlotRole, int]
    """By role: the tries that failed there (the retry policy's attempts made)."""
    stream: StreamRelay
    sent: RequestContext
    """What goes upstream: the request, or after a break its continuation."""
    last_error: UpstreamError | None = None
    spend: UpstreamError | None = None
    """The failure the next claim retries (one retry from the budget once its slots are claimed)."""
    continuing: bool = False
    """The next claim continues a broken stream."""
    stale_left: bool = True
    number: int = 0
    retries: int = 0
    resumes: int = 0


class TryLoop:
    """The loop of tries (module docstring); one per app."""

    def __init__(
        self,
        *,
        containment: Containment,
        registry: ReplicaRegistry,
        retry_policies: Mapping[str, RetryPolicy],
        events: ServeEvents,
    ) -> None:
        self._containment = containment
        self._registry = registry
        self._retry_policies = retry_policies
        self._events = events

    async def run(
        self,
        ctx: RequestContext,
        reply: Reply,
        ticket: Ticket[Slot],
        legs: Legs,
        failures: Mapping[SlotRole, RequestFailures],
    ) -> None:
        """Try until served or failed; every set's pending failures are settled whatever happens."""
        served = False
        try:
            await self._tries(ctx, reply, ticket, legs, failures)
            served = True
        finally:
            for role, side in legs.sets.items():
                settled = await self._containment.settle(ctx, failures[role], side.pool, served=served)
                self.charge(ctx, side.pool, settled)

    async def _tries(
        self,
        ctx: RequestContext,
        reply: Reply,
        ticket: Ticket[Slot],
        legs: Legs,
        failures: Mapping[SlotRole, RequestFailures],
    ) -> None:
        retry = self._retry_policies[ctx.model]
        retry.budget.record_request()
        keep = ctx.stream and ctx.pool.settings.continues_streams
        p = _Progress(
            excluded={role: set(ctx.routing.exclude) for role in legs.sets},  # a pin's exclusions hold
            attempts=dict.fromkeys(legs.sets, 0),
            stream=StreamRelay(ctx, reply, transcript=StreamTranscript() if keep else None),
            sent=ctx,
        )
        while True:
            self._claim(ctx, legs, ticket, p.excluded, p.last_error)
            if p.spend is not None:
                if not retry.spend(p.spend):
                    raise p.spend
                self._events.retried(ctx, str(failure_kind(p.spend)))
                p.spend = None
            if p.continuing:
                self._events.continued(ctx)
                p.continuing = False
            p.number += 1
            reply.decision = legs.decision(ticket)
            failed = await legs.run(Try(p.sent, reply, ticket, p.stream, p.number))
            if failed is None:
                return
            p.attempts[failed.role] += 1
            if failed.stale and p.stale_left:  # nobody's failure: once more, over a new connection
                p.stale_left = False
                self._events.retried(ctx, STALE_CONNECTION)
            else:
                if failed.stale:  # a second one: the replica's broken stream
                    failed = replace(failed, stale=False)
                await self._failed(ctx, reply, legs, failures, failed, retry, p)
            for role in legs.redo(failed):
                ticket.swap(role, None)
            if not failed.stale and not reply.started:  # a continuation does not back off
                p.retries += 1
                await asyncio.sleep(retry.backoff_s(p.retries))

    async def _failed(  # noqa: PLR0917 - the try's parts
        self,
        ctx: RequestContext,
        reply: Reply,
        legs: Legs,
        failures: Mapping[SlotRole, RequestFailures],
        failed: LegFailure,
        retry: RetryPolicy,
        p: _Progress,
    ) -> None:
        """Judge a failed leg on its set, then set up its retry or continuation (or raise the final
        error); the failed replica is excluded from its role's next claims."""
        failure, replica, pool = failed.error, failed.slot.replica, legs.sets[failed.role].pool
        if not failed.preempted:  # a preemption's cut is nobody's failure
            verdict = await self._containment.judge(ctx, failures[failed.role], failure, replica, pool)
            self.charge(ctx, pool, verdict.charges, failure)
            if verdict.quarantine and ctx.pool.settings.quarantine.enabled:
                raise await self._containment.quarantine(ctx, failures[failed.role], failure)
        if reply.started:  # the client has bytes: continue elsewhere, or end with the terminal error
            p.sent = self._continuation(ctx, p.stream, failure, p.resumes)
            p.resumes += 1
            p.continuing = True
        elif retry.eligible(failure, p.attempts[failed.role], ctx.routing):
            p.spend = failure
        else:
            raise failure
        p.last_error = failure
        p.excluded[failed.role].add(replica.replica_id)

    def _claim(
        self,
        ctx: RequestContext,
        legs: Legs,
        ticket: Ticket[Slot],
        excluded: Mapping[SlotRole, set[str]],
        last_error: UpstreamError | None,
    ) -> None:
        """A slot in every role the ticket lacks, routing again with that role's failed replicas
        excluded; the last failure (or `no_replica`) when a set has none."""
        for role, side in legs.sets.items():
            if ticket.slot(role) is None:
                slot = side.claim_excluding(ctx.routing, frozenset(excluded[role]))
                if slot is None:
                    raise last_error or from_refusal(legs.no_replica(role, ctx))
                ticket.swap(role, slot)

    def _continuation(
        self, ctx: RequestContext, stream: StreamRelay, failure: UpstreamError, resumes: int
    ) -> RequestContext:
        """The request that continues a stream broken after the first byte, or `failure` raised when
        it cannot be continued (`gateway.proxy.continuation`)."""
        transcript = stream.transcript
        resumable = isinstance(failure, RESUMABLE_FAILURES)
        if transcript is None or not resumable or resumes >= ctx.pool.settings.continuation.max_resumes:
            raise failure
        body = continuation_body(ctx.parsed, transcript, ctx.upstream_model)
        if body is None:
            raise failure
        stream.continue_with(Splice(transcript))
        return replace(ctx, upstream_body=body)

    def charge(
        self,
        ctx: RequestContext,
        pool: Pool,
        charges: tuple[Charge, ...],
        failure: UpstreamError | None = None,
    ) -> None:
        """Account charged failures of set `pool`: the event, and the registry for what is the
        replica's (breaker, passive health) or an engine's overload answer (its Retry-After hold)."""
        for charge in charges:
            self._events.charged(ctx, pool, charge)
            kind = charge.kind
            if kind is None:
                continue
            if charge.cause is FailureCause.REPLICA or kind is FailureKind.OVERLOADED:
                retry_after_s = None  # an engine's Retry-After belongs to the failure that carried it
                if failure is not None and failure.replica_id == charge.replica.replica_id:
                    retry_after_s = failure.retry_after_s
                self._registry.record_failure(charge.replica, kind, retry_after_s)
