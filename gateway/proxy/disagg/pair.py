"""The legs of a disaggregated pool (`gateway.proxy.legs`): a prefill leg on the prefill set, a decode
leg on the decode set, the decode's answer relayed to the client (`gateway.proxy.disagg.legs` for the
bodies). The ticket holds a PREFILL and a DECODE slot (`gateway.proxy.disagg.admit`).

    vLLM   : prefill leg (not streamed, max_tokens 1) → its kv_transfer_params → prefill slot released
             → decode leg (the try's body + those params) relayed
    SGLang : the try's body + bootstrap_host/port/room to both at once; the decode relayed, the
             prefill's answer drained and discarded, its slot released when drained

The try's body is the request's, or after a break its continuation's (`gateway.proxy.continuation`):
a continuation is a new prefill of the text so far, on any prefill replica, then a decode on another
decode replica. Timers span both hops: the decode leg's first-token deadline (`timeouts.ttft_s`) runs
from the start of the pair's prefill leg, so the client's TTFT bound covers prefill, transfer and first
decode step; a vLLM prefill leg must answer within `ttft_s` too (a late one is a first-token timeout of
the prefill replica). Each leg runs under the preemption notices of its replica.

Which leg failed a try: the vLLM prefill, or the decode; with SGLang, a prefill that fails before its
decode produced a token fails its room, so the decode leg is cut at once and the failure is the
prefill's; a decode that fails alone is the decode's. A failure gives back the failed role's slot and
the prefill's (after a decode's failure the KV is gone: the prefill is redone for another decode
replica); a stale keep-alive connection gives back the prefill's only (the pair once more). Only
completions and chat are served (the two legs are generation requests): other endpoints are a 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson

from admission.outcomes import AdmissionRefused
from admission.ticket import AdmissionRequest, SlotRole, Ticket
from gateway.base.errors import (
    BadRequest,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTotalTimeout,
    UpstreamTTFTTimeout,
)
from gateway.proxy.admit import PoolAdmission
from gateway.proxy.context import RequestContext
from gateway.proxy.disagg.admit import PairAdmission
from gateway.proxy.disagg.decision import PairDecision
from gateway.proxy.disagg.legs import (
    ROOM_BITS,
    BootstrapPorts,
    bootstrap_host,
    kv_transfer_params,
    sglang_body,
    vllm_decode_body,
    vllm_prefill_body,
)
from gateway.proxy.legs import LegFailure, LegRunner, Try, stale_failure
from gateway.proxy.send import StaleConnection, forget_frames
from gateway.upstream.slot import Slot
from router.types import Decision

_PREFILL = (SlotRole.PREFILL,)


@dataclass(frozen=True, slots=True)
class _Pair:
    """One try's two slots, the body both legs extend, and the prefill leg's start (the decode leg's
    deadlines run from it too)."""

    prefill: Slot
    decode: Slot
    base: dict[str, Any]
    started_s: float


class PrefillDecode:
    """A disaggregated pool's legs (module docstring). `bootstrap`: an SGLang pool's bootstrap ports
    (None: vLLM) and the RNG of its rooms."""

    def __init__(
        self,
        pair: PairAdmission,
        leg: LegRunner,
        bootstrap: BootstrapPorts | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._pair = pair
        self._leg = leg
        self._bootstrap = bootstrap
        self._rng = rng or random.Random()
        self._sets = {SlotRole.PREFILL: pair.prefill, SlotRole.DECODE: pair.decode}

    @property
    def sets(self) -> Mapping[SlotRole, PoolAdmission]:
        return self._sets

    def check(self, ctx: RequestContext) -> None:
        if not ctx.parsed.endpoint.can_stream:
            raise BadRequest(f"model {ctx.model!r} is served disaggregated: only completions and chat")

    async def admit(self, request: AdmissionRequest) -> Ticket[Slot]:
        return await self._pair.admit(request)

    def queue_depth(self) -> int:
        return self._pair.queue_depth()

    def no_replica(self, role: SlotRole, ctx: RequestContext) -> AdmissionRefused:
        return self._pair.no_replica(self._sets[role])

    def decision(self, ticket: Ticket[Slot]) -> Decision:
        prefill, decode = ticket.slot(SlotRole.PREFILL), ticket.slot(SlotRole.DECODE)
        assert prefill is not None and decode is not None
        return PairDecision.of(prefill.decision, decode.decision)

    def redo(self, failure: LegFailure) -> tuple[SlotRole, ...]:
        if failure.stale or failure.role is SlotRole.PREFILL:
            return _PREFILL
        return (failure.role, SlotRole.PREFILL)

    async def run(self, t: Try) -> LegFailure | None:
        prefill, decode = t.ticket.slot(SlotRole.PREFILL), t.ticket.slot(SlotRole.DECODE)
        assert prefill is not None and decode is not None
        pair = _Pair(prefill, decode, orjson.loads(t.ctx.upstream_body), self._leg.now_s())
        if self._bootstrap is not None:
            return await self._sglang(t, pair, self._bootstrap)
        params = await self._vllm_prefill(t, pair)
        if isinstance(params, LegFailure):
            return params
        t.ticket.swap(SlotRole.PREFILL, None)  # answered: its KV waits for the decode's pull
        decode_ctx = replace(t.ctx, upstream_body=vllm_decode_body(pair.base, params))
        return await self._decode(t, pair, decode_ctx)

    async def _decode(self, t: Try, pair: _Pair, ctx: RequestContext) -> LegFailure | None:
        """The decode leg (`ctx` carries its body), relayed to the client from the pair's start."""
        attempt = self._leg.attempt(pair.decode, t.number, pair.started_s)
        return await self._leg.relayed(ctx, t, attempt, SlotRole.DECODE, self._pair.decode.pool)

    async def _vllm_prefill(self, t: Try, pair: _Pair) -> dict[str, Any] | LegFailure:
        """The prefill leg; its answer's kv_transfer_params, or its failure."""
        ctx, slot = t.ctx, pair.prefill
        timers = ctx.timers
        leg_ctx = replace(
            ctx,
            upstream_body=vllm_prefill_body(pair.base),
            parsed=replace(ctx.parsed, stream=False),
            timers=replace(timers, nonstream_s=timers.ttft_s),
        )
        attempt = self._leg.attempt(slot, t.number, pair.started_s)
        events = self._leg.events
        events.attempt_started(ctx, t.number, slot)
        rid = slot.replica.replica_id
        failure: UpstreamError
        try:
            with self._leg.preemption.running(attempt):
                attempt.response = await self._leg.send(leg_ctx, attempt, resend=True)
                self._leg.registry.record_success(slot.replica)
                async with asyncio.timeout(timers.ttft_s - attempt.elapsed_s()):
                    answer = await attempt.response.read()
            params = kv_transfer_params(answer, rid)
        except StaleConnection as stale:
            events.attempt_ended(ctx, stale)
            return stale_failure(SlotRole.PREFILL, attempt)
        except (UpstreamTotalTimeout, TimeoutError):
            late = f"did not answer within the first-token deadline of {timers.ttft_s} s"
            failure = UpstreamTTFTTimeout(f"prefill replica {rid} {late}", replica_id=rid)
        except UpstreamError as failed:
            failure = failed
        except aiohttp.ClientError as exc:
            failure = _broken(rid, exc)
        else:
            slot.first_token()  # the prefill's latency model learns its time to the answer
            self._prefilled(ctx, slot, attempt.elapsed_s())
            events.attempt_ended(ctx, None)
            return params
        finally:
            attempt.close()
        events.attempt_ended(ctx, failure)
        return LegFailure(SlotRole.PREFILL, failure, slot, preempted=attempt.preempted)

    async def _sglang(self, t: Try, pair: _Pair, bootstrap: BootstrapPorts) -> LegFailure | None:
        """Both legs at once; a prefill that fails before the decode produced a token cuts the decode
        (its room can never complete)."""
        ctx, prefill = t.ctx, pair.prefill
        try:
            port = await bootstrap.port_of(prefill.replica, dict(ctx.upstream_headers))
        except UpstreamError as error:
            return LegFailure(SlotRole.PREFILL, error, prefill)
        room = self._rng.getrandbits(ROOM_BITS)
        leg_ctx = replace(
            ctx, upstream_body=sglang_body(pair.base, bootstrap_host(prefill.replica), port, room)
        )
        prefill_leg = asyncio.create_task(self._sglang_prefill(t, pair, leg_ctx))
        decode_leg = asyncio.create_task(self._decode(t, pair, leg_ctx))
        try:
            await asyncio.wait((prefill_leg, decode_leg), return_when=asyncio.FIRST_COMPLETED)
            if prefill_leg.done() and prefill_leg.result() is not None and not pair.decode.decoding:
                decode_leg.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await decode_leg
                return prefill_leg.result()
            decode_failure = await decode_leg
            if decode_failure is not None and not prefill_leg.done():
                prefill_leg.cancel()  # the pair is redone with a new room
            with contextlib.suppress(asyncio.CancelledError):
                await prefill_leg
            return decode_failure
        finally:
            for leg in (prefill_leg, decode_leg):
                leg.cancel()

    async def _sglang_prefill(self, t: Try, pair: _Pair, ctx: RequestContext) -> LegFailure | None:
        """The SGLang prefill leg, its answer drained and discarded, its slot released when drained."""
        slot = pair.prefill
        attempt = self._leg.attempt(slot, t.number, pair.started_s)
        rid = slot.replica.replica_id
        failure: UpstreamError
        try:
            with self._leg.preemption.running(attempt):
                attempt.response = await self._leg.send(ctx, attempt)
                self._leg.registry.record_success(slot.replica)
                bound_s = ctx.timers.ttft_s if ctx.stream else ctx.timers.nonstream_s
                async with asyncio.timeout(bound_s - attempt.elapsed_s()):
                    await attempt.response.read()
        except StaleConnection:
            return stale_failure(SlotRole.PREFILL, attempt)
        except UpstreamError as error:
            failure = error
        except TimeoutError:
            failure = UpstreamTTFTTimeout(
                f"prefill replica {rid} did not finish its leg in time", replica_id=rid
            )
        except aiohttp.ClientError as exc:
            failure = _broken(rid, exc)
        else:
            slot.first_token()
            self._prefilled(ctx, slot, attempt.elapsed_s())
            t.ticket.swap(SlotRole.PREFILL, None)
            return None
        finally:
            attempt.close()
        return LegFailure(SlotRole.PREFILL, failure, slot, preempted=attempt.preempted)

    def _prefilled(self, ctx: RequestContext, slot: Slot, leg_s: float) -> None:
        pool = self._pair.prefill.pool
        self._leg.served(pool, slot)
        self._leg.events.prefilled(ctx, pool, leg_s)


def _broken(replica_id: str, exc: Exception) -> UpstreamProtocolError:
    message = f"prefill replica {replica_id} broke off its answer: {forget_frames(exc)!r}"
    return UpstreamProtocolError(message, replica_id=replica_id)
