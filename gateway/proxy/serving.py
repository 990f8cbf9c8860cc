"""Serve one request whose context is built: admit it, try replicas until one answers, relay, release.

    ticket  = admit(ctx)                                   a slot on a replica (or 401/429/503)
    attempt = the ticket's slot; on a retryable failure before the first byte: close the attempt,
              release its slot (`ticket.swap`), back off, claim a slot on another replica (routing
              again with the failed ones excluded) — within max_attempts and the retry budget
    relay   = stream or whole response to the client (`gateway.proxy.relay`)
    finally = close the attempt's upstream response, release the ticket (slot, forecast key, tenant
              lease), reconcile the tenant's token bucket with the actual usage

The retry rules are `gateway.proxy.retry_policy`'s. A try that hit a keep-alive connection the engine
had already closed (`StaleConnection`) is tried once more on the same replica over a new connection
(not held against the replica, not charged to the budget); a second such close is a broken stream.

Every failed try is charged to its cause (`gateway.proxy.failure_attribution`): only a replica's own
failures reach its breaker (`ReplicaRegistry.record_failure`); an engine's 429/503 still holds the
replica out for its Retry-After. A request whose failures two replicas show while both keep serving
other requests — its own tries, or identical requests' (`gateway.proxy.containment`) — is a poison
request: 422 `request_quarantined`, no third replica, and its fingerprint is refused at arrival for the
pool's `quarantine.ttl_s` (`gateway.proxy.quarantine`).

Each step is told to the request's `RequestRecord` (`ctx.record`, `gateway.observability`): admission,
each try with its routing decision, the relay, retries, continuations and the final error — the spans
and the access-log line. With tracing and access log off it is a shared no-op.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

from admission.ticket import AdmissionRequest, SlotRole, Ticket
from core.clock import Clock
from gateway.api.asgi_io import Scope
from gateway.autoscaling import AutoscaleSignals
from gateway.errors import (
    GatewayError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamIdleTimeout,
    UpstreamProtocolError,
    UpstreamTTFTTimeout,
    from_refusal,
)
from gateway.metrics import GatewayMetrics
from gateway.observability.observer import RequestObserver
from gateway.observability.request_record import RequestRecord
from gateway.proxy.admit import Admission, PoolAdmission
from gateway.proxy.attempt import Attempt
from gateway.proxy.containment import Containment
from gateway.proxy.context import RequestContext
from gateway.proxy.continuation import Splice, StreamTranscript, continuation_body
from gateway.proxy.disagg_legs import BootstrapPorts
from gateway.proxy.disagg_serving import DisaggServer
from gateway.proxy.failure_attribution import Charge, FailureCause, RequestFailures
from gateway.proxy.preemption import Preemption
from gateway.proxy.relay import StreamRelay, relay
from gateway.proxy.reply import Reply
from gateway.proxy.retry_policy import RetryPolicy, failure_kind
from gateway.proxy.send import StaleConnection, UpstreamClient
from gateway.upstream.registry import FailureKind, ReplicaRegistry
from gateway.upstream.slot import Slot

RESUMABLE_FAILURES = (UpstreamIdleTimeout, UpstreamProtocolError, UpstreamTTFTTimeout, UpstreamConnectError)
"""Failures after the first byte that a continuation on another replica repairs (the replica went
silent, broke off or truncated the stream; a continuation's own try stalled or could not connect)."""


class RequestServer:
    """The serve path after the edge (module docstring); one per app."""

    def __init__(
        self,
        *,
        admission: Admission,
        upstream: UpstreamClient,
        registry: ReplicaRegistry,
        retry_policies: dict[str, RetryPolicy],
        containment: Containment,
        preemption: Preemption,
        signals: AutoscaleSignals,
        metrics: GatewayMetrics,
        observer: RequestObserver,
        clock: Clock,
        bootstrap: dict[str, BootstrapPorts] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """`bootstrap` (SGLang disaggregated pools) and `rng` (their bootstrap rooms) serve
        disaggregated pools (`gateway.proxy.disagg_serving`)."""
        self._observer = observer
        self._clock = clock
        self._admission = admission
        self._upstream = upstream
        self._registry = registry
        self._retry_policies = retry_policies
        self._containment = containment
        self._preemption = preemption
        self._signals = signals
        self._metrics = metrics
        self._disagg = DisaggServer(
            admission=admission,
            upstream=upstream,
            registry=registry,
            retry_policies=retry_policies,
            attribution=containment.attributions,
            bootstrap=bootstrap or {},
            charge=self._charge,
            metrics=metrics,
            clock=clock,
            rng=rng or random.Random(),
        )

    def observe(self, scope: Scope, request_id: str, endpoint: str) -> RequestRecord:
        """The record of a request to `endpoint` that just arrived (its server span starts now when
        tracing)."""
        return self._observer.begin(scope, request_id, endpoint)

    async def serve(self, ctx: RequestContext, reply: Reply) -> None:
        """Admit, try, relay; everything taken is released before this returns or raises."""
        try:
            await self._serve(ctx, reply)
        except GatewayError as error:
            ctx.record.failed(error)
            raise

    async def _serve(self, ctx: RequestContext, reply: Reply) -> None:
        model = ctx.model
        record = ctx.record
        if ctx.pool.prefill is not None:  # a disaggregated pool: two legs, two slots
            await self._disagg.serve(ctx, reply)
            return
        ctx, failures = self._containment.arrive(ctx)  # 422 when quarantined; routed away from its failures
        admission = self._admission.pool(model)
        self._signals.arrival(model)
        record.admission_started(admission.queue_depth)
        try:
            ticket = await admission.admit(
                AdmissionRequest(ctx.tenant, ctx.priority, ctx.routing.estimated_total_tokens, ctx.routing)
            )
        except GatewayError as refused:
            record.admission_ended(None, refused)
            raise
        record.admission_ended(ticket.queue_wait_s)
        reply.queue_wait_s = ticket.queue_wait_s
        self._signals.dispatched(model, ticket.queue_wait_s)
        try:
            await self._attempts(ctx, reply, ticket, admission, failures)
            completion = (reply.usage or {}).get("completion_tokens")
            if isinstance(completion, int):
                self._signals.completed(
                    model,
                    output_tokens=completion,
                    e2e_s=reply.elapsed_s(),
                    ttft_s=reply.first_output_s,
                    queue_wait_s=ticket.queue_wait_s,
                )
        finally:
            await ticket.release()
            actual = _actual_tokens(reply)
            if actual is not None:
                await ticket.reconcile(actual)

    async def _attempts(
        self,
        ctx: RequestContext,
        reply: Reply,
        ticket: Ticket[Slot],
        admission: PoolAdmission,
        failures: RequestFailures,
    ) -> None:
        """The retry loop (see `gateway.proxy.retry_policy` for when a failure is retried)."""
        served = False
        try:
            await self._tries(ctx, reply, ticket, admission, failures)
            served = True
        finally:
            self._charge(ctx, await self._containment.settle(ctx, failures, served=served))

    async def _tries(
        self,
        ctx: RequestContext,
        reply: Reply,
        ticket: Ticket[Slot],
        admission: PoolAdmission,
        failures: RequestFailures,
    ) -> None:
        retry = self._retry_policies[ctx.model]
        retry.budget.record_request()
        excluded: set[str] = set(ctx.routing.exclude)  # a pinned request's exclusions hold on retries
        last_error: UpstreamError | None = None
        stale_retry_left = True
        number = resumes = 0
        keep = ctx.stream and ctx.pool.settings.continues_streams
        stream = StreamRelay(ctx, reply, transcript=StreamTranscript() if keep else None)
        sent_ctx = ctx  # what goes upstream: the request, or after a break its continuation
        while True:
            slot = ticket.slot(SlotRole.SERVE)
            if slot is None:
                slot = self._reclaim(ctx, admission, excluded, last_error, retry, continuing=reply.started)
                ticket.swap(SlotRole.SERVE, slot)
                if sent_ctx is not ctx and reply.started:
                    self._metrics.stream_continuations_total.labels(ctx.model).inc()
                    ctx.record.continued()
            number += 1
            reply.decision = slot.decision
            replica = slot.replica
            attempt = Attempt(slot, number, self._clock)
            ctx.record.attempt_started(number, slot)
            outcome = await self._try(sent_ctx, reply, attempt, stream)
            if outcome is None:
                return
            if isinstance(outcome, StaleConnection):
                if stale_retry_left:  # once more on the same replica, over a new connection
                    stale_retry_left = False
                    self._metrics.retries_total.labels("stale_connection").inc()
                    ctx.record.retried("stale_connection")
                    continue
                outcome = UpstreamProtocolError(
                    f"replica {replica.replica_id} closed the connection before answering",
                    replica_id=replica.replica_id,
                )
            failure = outcome
            if not attempt.preempted:  # a preemption's cut is nobody's failure
                verdict = await self._containment.judge(ctx, failures, failure, replica)
                self._charge(ctx, verdict.charges, failure)
                if verdict.quarantine and ctx.pool.settings.quarantine.enabled:
                    raise await self._containment.quarantine(ctx, failures, failure)
            if reply.started:  # the client has bytes: continue elsewhere, or end with the terminal error
                sent_ctx = self._continuation(ctx, stream, failure, resumes)
                resumes += 1
            elif not retry.eligible(failure, number, ctx.routing):
                raise failure
            last_error = failure
            excluded.add(replica.replica_id)
            ticket.swap(SlotRole.SERVE, None)
            if not reply.started:  # a continuation does not back off: the client is mid-stream
                await asyncio.sleep(retry.backoff_s(len(excluded)))

    async def _try(
        self, sent_ctx: RequestContext, reply: Reply, attempt: Attempt, stream: StreamRelay
    ) -> UpstreamError | StaleConnection | None:
        """One try: send, then relay; None when the response went through, else what failed. The
        attempt is closed whatever happens (an unfinished upstream response is aborted)."""
        record = sent_ctx.record
        try:
            with self._preemption.running(attempt):
                attempt.response = await self._upstream.send(sent_ctx, attempt)
                self._registry.record_success(attempt.slot.replica)
                record.relay_started()
                await relay(sent_ctx, reply, attempt, stream)
            completion = (reply.usage or {}).get("completion_tokens")
            if isinstance(completion, int):
                attempt.slot.finished(completion)  # the replica's latency model learns its TPOT
            self._registry.record_served(attempt.slot.replica)
            self._containment.attribution(sent_ctx.model).first_token_served(attempt.slot.replica)
            record.attempt_ended(None)
            return None
        except StaleConnection as stale:
            record.attempt_ended(stale)
            return stale
        except UpstreamError as error:
            record.attempt_ended(error)
            return error
        finally:
            attempt.close()

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

    def _charge(
        self, ctx: RequestContext, charges: tuple[Charge, ...], failure: UpstreamError | None = None
    ) -> None:
        """Account charged failures: the metric, and the registry for what is the replica's (breaker,
        passive health) or an engine's overload answer (its Retry-After hold)."""
        for charge in charges:
            kind = charge.kind
            label = "none" if kind is None else str(kind)
            self._metrics.upstream_failures_total.labels(ctx.model, charge.cause, label).inc()
            ctx.record.failure_charged(charge.replica.replica_id, label, str(charge.cause))
            if kind is None:
                continue
            if charge.cause is FailureCause.REPLICA or kind is FailureKind.OVERLOADED:
                retry_after_s = None  # an engine's Retry-After belongs to the failure that carried it
                if failure is not None and failure.replica_id == charge.replica.replica_id:
                    retry_after_s = failure.retry_after_s
                self._registry.record_failure(charge.replica, kind, retry_after_s)

    def _reclaim(
        self,
        ctx: RequestContext,
        admission: PoolAdmission,
        excluded: set[str],
        last_error: UpstreamError | None,
        retry: RetryPolicy,
        *,
        continuing: bool,
    ) -> Slot:
        """A slot for the next try, or the final error (nothing eligible, or no budget left). A
        continuation (`continuing`: the client has bytes) is owed its try: it is no retry and does not
        draw from the budget — it moves a stream the pool already admitted, bounded by `max_resumes`."""
        slot = admission.claim_excluding(ctx.routing, frozenset(excluded))
        if slot is None:
            raise last_error or from_refusal(admission.no_replica(ctx.routing.model))
        if last_error is not None and not continuing:
            if not retry.spend(last_error):
                slot.release()
                raise last_error
            reason = str(failure_kind(last_error))
            self._metrics.retries_total.labels(reason).inc()
            ctx.record.retried(reason)
        return slot


def _actual_tokens(reply: Reply) -> int | None:
    usage = reply.usage or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        return prompt + completion
    return None
