"""Serve one request of a disaggregated pool: a prefill leg on the prefill set, a decode leg on the
decode set, the decode's answer relayed to the client (`gateway.proxy.disagg_legs` for the bodies).

    ticket = admit (`gateway.proxy.disagg_admit`): a PREFILL and a DECODE slot, both under their cap
    vLLM   : prefill leg (not streamed, max_tokens 1) → its kv_transfer_params → prefill slot released
             → decode leg (the client's body + those params) relayed
    SGLang : the body + bootstrap_host/port/room to both at once; the decode relayed, the prefill's
             answer drained and discarded, its slot released when drained
    finally: ticket released (what is left of the pair), tenant bucket reconciled

Timers span both hops: the decode leg's first-token deadline (`timeouts.ttft_s`) runs from the start of
the pair's prefill leg, so the client's TTFT bound covers prefill, transfer and first decode step; a
vLLM prefill leg must answer within `ttft_s` too (a late one is a first-token timeout of the prefill
replica). Failures, each charged to the replica of its own set (`failure_attribution` of the prefill
set's pool `<model>/prefill` or of the pool; breakers, passive health and Retry-After holds per
replica):
- the prefill leg fails → another prefill replica (the failed one excluded), same decode slot;
- the decode leg fails before the first byte to the client → the prefill is redone (the KV is gone)
  for another decode replica (the failed one excluded), on any prefill replica;
- SGLang: a prefill that fails fails its room, so the decode leg is cut at once and the failure is the
  prefill's; a decode that fails alone is the decode's.
Retries follow the pool's retry policy: a retryable failure, at most `retries.max_attempts` tries per
leg, one retry from the pool's budget per retry, jittered backoff. After the first byte to the client
a failure is final: mid-stream continuation is off for disaggregated pools (it would need its own
prefill leg). Poison-request quarantine is not applied to disaggregated pools yet (a failure that the
attribution calls the request's is final).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson

from admission.ticket import AdmissionRequest, SlotRole, Ticket
from core.clock import Clock
from gateway.errors import (
    BadRequest,
    GatewayError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTotalTimeout,
    UpstreamTTFTTimeout,
    from_refusal,
)
from gateway.metrics import GatewayMetrics
from gateway.proxy.admit import Admission, PoolAdmission
from gateway.proxy.attempt import Attempt
from gateway.proxy.context import RequestContext
from gateway.proxy.disagg_decision import PairDecision
from gateway.proxy.disagg_legs import (
    ROOM_BITS,
    BootstrapPorts,
    bootstrap_host,
    kv_transfer_params,
    sglang_body,
    vllm_decode_body,
    vllm_prefill_body,
)
from gateway.proxy.failure_attribution import Charge, PoolAttribution, RequestFailures
from gateway.proxy.relay import StreamRelay, relay
from gateway.proxy.reply import Reply
from gateway.proxy.retry_policy import RetryPolicy, failure_kind
from gateway.proxy.send import StaleConnection, UpstreamClient, forget_frames
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.slot import Slot

Charger = Callable[[RequestContext, tuple[Charge, ...], UpstreamError | None], None]
PairTicket = Ticket[Slot]
LegFailure = tuple[SlotRole, UpstreamError]


class DisaggServer:
    """The serve path of disaggregated pools (module docstring); one per app."""

    def __init__(
        self,
        *,
        admission: Admission,
        upstream: UpstreamClient,
        registry: ReplicaRegistry,
        retry_policies: dict[str, RetryPolicy],
        attribution: dict[str, PoolAttribution],
        bootstrap: dict[str, BootstrapPorts],
        charge: Charger,
        metrics: GatewayMetrics,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self._admission = admission
        self._upstream = upstream
        self._registry = registry
        self._retry_policies = retry_policies
        self._attribution = attribution
        self._bootstrap = bootstrap
        self._charge = charge
        self._metrics = metrics
        self._clock = clock
        self._rng = rng

    async def serve(self, ctx: RequestContext, reply: Reply) -> None:
        """Admit, serve, release the ticket and reconcile the tenant's bucket with the actual usage."""
        if not ctx.parsed.endpoint.can_stream:
            raise BadRequest(f"model {ctx.model!r} is served disaggregated: only completions and chat")
        pair = self._admission.pair(ctx.model)
        record = ctx.record
        record.admission_started(pair.queue_depth)
        request = AdmissionRequest(ctx.tenant, ctx.priority, ctx.routing.estimated_total_tokens, ctx.routing)
        try:
            ticket = await pair.admit(request)
        except GatewayError as refused:
            record.admission_ended(None, refused)
            raise
        record.admission_ended(ticket.queue_wait_s)
        reply.queue_wait_s = ticket.queue_wait_s
        try:
            await self._attempts(ctx, reply, ticket, pair.prefill, pair.decode)
        finally:
            await ticket.release()
            usage = reply.usage or {}
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int) and isinstance(completion, int):
                await ticket.reconcile(prompt + completion)

    async def _attempts(
        self, ctx: RequestContext, reply: Reply, ticket: PairTicket, pre: PoolAdmission, dec: PoolAdmission
    ) -> None:
        failures = {
            SlotRole.PREFILL: self._attribution[pre.pool.model].for_request(),
            SlotRole.DECODE: self._attribution[ctx.model].for_request(),
        }
        served = False
        try:
            await self._tries(ctx, reply, ticket, {SlotRole.PREFILL: pre, SlotRole.DECODE: dec}, failures)
            served = True
        finally:
            for side, failed in ((pre, failures[SlotRole.PREFILL]), (dec, failures[SlotRole.DECODE])):
                self._charge(replace(ctx, pool=side.pool), failed.settle(served=served), None)

    async def _tries(
        self,
        ctx: RequestContext,
        reply: Reply,
        ticket: PairTicket,
        sides: dict[SlotRole, PoolAdmission],
        failures: dict[SlotRole, RequestFailures],
    ) -> None:
        retry = self._retry_policies[ctx.model]
        retry.budget.record_request()
        excluded: dict[SlotRole, set[str]] = {SlotRole.PREFILL: set(), SlotRole.DECODE: set()}
        tries = dict.fromkeys(excluded, 0)
        last_error: UpstreamError | None = None
        stream = StreamRelay(ctx, reply)
        number = 0
        stale_left = True
        while True:
            for role, side in sides.items():
                if ticket.slot(role) is None:
                    ticket.swap(role, _claim(side, ctx, excluded[role], last_error))
            prefill, decode = ticket.slot(SlotRole.PREFILL), ticket.slot(SlotRole.DECODE)
            assert prefill is not None and decode is not None
            number += 1
            reply.decision = PairDecision.of(prefill.decision, decode.decision)
            outcome = await self._pair_try(ctx, reply, ticket, number, stream)
            if outcome is None:
                return
            role, failure = outcome
            slot = prefill if role is SlotRole.PREFILL else decode
            if isinstance(failure, StaleLeg) and stale_left and not reply.started:
                stale_left = False  # nobody's failure: the pair once more, on the same replicas
                ticket.swap(SlotRole.PREFILL, None)
                continue
            pool = sides[role].pool
            verdict = failures[role].record(failure_kind(failure), slot.replica, pool)
            self._charge(replace(ctx, pool=pool), verdict.charges, failure)  # labelled by the set's pool
            tries[role] += 1
            if reply.started or verdict.quarantine or not retry.eligible(failure, tries[role], ctx.routing):
                raise failure
            if not retry.spend(failure):
                raise failure
            reason = str(failure_kind(failure))  # which set: upstream_failures_total's model label
            self._metrics.retries_total.labels(reason).inc()
            ctx.record.retried(reason)
            last_error = failure
            excluded[role].add(slot.replica.replica_id)
            ticket.swap(role, None)
            ticket.swap(SlotRole.PREFILL, None)  # a decode's failure: the KV is gone, prefill again
            await asyncio.sleep(retry.backoff_s(sum(tries.values())))

    async def _pair_try(
        self, ctx: RequestContext, reply: Reply, ticket: PairTicket, number: int, stream: StreamRelay
    ) -> LegFailure | None:
        """One try of the pair held by `ticket`: None when the client got its answer, else the failed
        leg's role and error. The pair's deadlines start now."""
        prefill, decode = ticket.slot(SlotRole.PREFILL), ticket.slot(SlotRole.DECODE)
        assert prefill is not None and decode is not None
        base = orjson.loads(ctx.upstream_body)
        run = _PairTry(ctx, reply, ticket, stream, prefill, decode, number, base, self._clock.now_s())
        settings = ctx.pool.settings.disaggregation
        assert settings is not None
        if settings.protocol == "sglang":
            return await self._sglang(run)
        params = await self._vllm_prefill(run)
        if isinstance(params, UpstreamError):
            return SlotRole.PREFILL, params
        ticket.swap(SlotRole.PREFILL, None)  # answered: its KV waits for the decode's pull
        failure = await self._decode(run, replace(ctx, upstream_body=vllm_decode_body(run.base, params)))
        return None if failure is None else (SlotRole.DECODE, failure)

    async def _vllm_prefill(self, run: _PairTry) -> dict[str, Any] | UpstreamError:
        """The prefill leg; its answer's kv_transfer_params, or its failure."""
        ctx, slot = run.ctx, run.prefill
        timers = ctx.timers
        leg_ctx = replace(
            ctx,
            upstream_body=vllm_prefill_body(run.base),
            parsed=replace(ctx.parsed, stream=False),
            timers=replace(timers, nonstream_s=timers.ttft_s),
        )
        attempt = Attempt(slot, run.number, self._clock, run.started_s)
        ctx.record.attempt_started(run.number, slot)
        rid = slot.replica.replica_id
        try:
            attempt.response = await self._send(leg_ctx, attempt, resend=True)
            self._registry.record_success(slot.replica)
            async with asyncio.timeout(timers.ttft_s - attempt.elapsed_s()):
                answer = await attempt.response.read()
            params = kv_transfer_params(answer, rid)
        except (UpstreamTotalTimeout, TimeoutError):
            late = f"did not answer within the first-token deadline of {timers.ttft_s} s"
            return _ended(ctx, UpstreamTTFTTimeout(f"prefill replica {rid} {late}", replica_id=rid))
        except UpstreamError as failed:
            return _ended(ctx, failed)
        except aiohttp.ClientError as exc:
            return _ended(ctx, _broken(rid, exc))
        finally:
            attempt.close()
        slot.first_token()  # the prefill's latency model learns its time to the answer
        self._served(ctx.pool.prefill, slot)
        ctx.record.attempt_ended(None)
        return params

    async def _decode(self, run: _PairTry, ctx: RequestContext) -> UpstreamError | None:
        """The decode leg (`ctx` carries its body), relayed to the client; its deadlines run from the
        pair's start."""
        slot = run.decode
        attempt = Attempt(slot, run.number, self._clock, run.started_s)
        ctx.record.attempt_started(run.number, slot)
        try:
            attempt.response = await self._send(ctx, attempt, resend=False)
            self._registry.record_success(slot.replica)
            ctx.record.relay_started()
            await relay(ctx, run.reply, attempt, run.stream)
        except UpstreamError as error:
            ctx.record.attempt_ended(error)
            return error
        finally:
            attempt.close()
        completion = (run.reply.usage or {}).get("completion_tokens")
        if isinstance(completion, int):
            slot.finished(completion)
        self._served(ctx.pool, slot)
        ctx.record.attempt_ended(None)
        return None

    async def _sglang(self, run: _PairTry) -> LegFailure | None:
        """Both legs at once; a failed prefill cuts the decode (its room can never complete)."""
        ctx, prefill = run.ctx, run.prefill
        try:
            port = await self._bootstrap[ctx.model].port_of(prefill.replica, dict(ctx.upstream_headers))
        except UpstreamError as error:
            return SlotRole.PREFILL, error
        room = self._rng.getrandbits(ROOM_BITS)
        body = sglang_body(run.base, bootstrap_host(prefill.replica), port, room)
        leg_ctx = replace(ctx, upstream_body=body)
        prefill_leg = asyncio.create_task(self._sglang_prefill(run, leg_ctx))
        decode_leg = asyncio.create_task(self._decode(run, leg_ctx))
        try:
            await asyncio.wait((prefill_leg, decode_leg), return_when=asyncio.FIRST_COMPLETED)
            if prefill_leg.done() and prefill_leg.result() is not None and not run.reply.started:
                decode_leg.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await decode_leg
                failed = prefill_leg.result()
                assert failed is not None
                return SlotRole.PREFILL, failed
            decode_failure = await decode_leg
            if decode_failure is not None and not prefill_leg.done():
                prefill_leg.cancel()  # the pair is redone with a new room
            with contextlib.suppress(asyncio.CancelledError):
                await prefill_leg
            return None if decode_failure is None else (SlotRole.DECODE, decode_failure)
        finally:
            for leg in (prefill_leg, decode_leg):
                leg.cancel()

    async def _sglang_prefill(self, run: _PairTry, ctx: RequestContext) -> UpstreamError | None:
        """The SGLang prefill leg, its answer drained and discarded, its slot released when drained."""
        slot = run.prefill
        attempt = Attempt(slot, run.number, self._clock, run.started_s)
        rid = slot.replica.replica_id
        try:
            attempt.response = await self._send(ctx, attempt, resend=False)
            self._registry.record_success(slot.replica)
            bound_s = (ctx.timers.ttft_s if ctx.stream else ctx.timers.nonstream_s) - attempt.elapsed_s()
            async with asyncio.timeout(bound_s):
                await attempt.response.read()
        except UpstreamError as error:
            return error
        except TimeoutError:
            late = f"prefill replica {rid} did not finish its leg in time"
            return UpstreamTTFTTimeout(late, replica_id=rid)
        except aiohttp.ClientError as exc:
            return _broken(rid, exc)
        finally:
            attempt.close()
        slot.first_token()
        self._served(ctx.pool.prefill, slot)
        run.ticket.swap(SlotRole.PREFILL, None)
        return None

    async def _send(self, ctx: RequestContext, attempt: Attempt, *, resend: bool) -> aiohttp.ClientResponse:
        """`UpstreamClient.send`; after a stale keep-alive connection, once more over a new one when
        `resend` (a vLLM prefill leg), else `StaleLeg` (a decode or SGLang leg may have consumed its
        transfer or room: the pair is redone)."""
        rid = attempt.slot.replica.replica_id
        for _ in range(2 if resend else 1):
            try:
                return await self._upstream.send(ctx, attempt)
            except StaleConnection:
                continue
        raise StaleLeg(f"replica {rid} closed the connection before answering", replica_id=rid)

    def _served(self, pool: Pool | None, slot: Slot) -> None:
        if pool is None:
            return
        self._registry.record_served(slot.replica)
        self._attribution[pool.model].first_token_served(slot.replica)


class StaleLeg(UpstreamProtocolError):
    """A leg hit a keep-alive connection the engine had closed (see `DisaggServer._send`)."""


@dataclass(slots=True)
class _PairTry:
    """One try of the pair: what its legs share."""

    ctx: RequestContext
    reply: Reply
    ticket: PairTicket
    stream: StreamRelay
    prefill: Slot
    decode: Slot
    number: int
    base: dict[str, Any]
    """The upstream body as JSON, which both legs extend."""
    started_s: float
    """The start of the prefill leg: the decode's deadlines run from here too."""


def _ended(ctx: RequestContext, error: UpstreamError) -> UpstreamError:
    ctx.record.attempt_ended(error)
    return error


def _broken(replica_id: str, exc: Exception) -> UpstreamProtocolError:
    message = f"prefill replica {replica_id} broke off its answer: {forget_frames(exc)!r}"
    return UpstreamProtocolError(message, replica_id=replica_id)


def _claim(
    side: PoolAdmission, ctx: RequestContext, excluded: set[str], last_error: UpstreamError | None
) -> Slot:
    """A slot on `side` for the next try, excluding the replicas that failed there; else the last
    error, or `no_replica` when there was none."""
    slot = side.claim_excluding(ctx.routing, frozenset(excluded))
    if slot is None:
        raise last_error or from_refusal(side.no_replica())
    return slot
