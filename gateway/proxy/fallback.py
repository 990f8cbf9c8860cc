"""Per-pool fallback: a request its pool refuses goes to the next pool of the pool's `fallback` list.

What falls back: a refusal before a byte went to the client — `no_replica` (nothing up that serves
the name) and `queue_full` (the queue is full, or early refusal forecast no slot within the class's
wait) — from admission or from the retry loop's re-routing. Not `queue_timeout` (the client has
already waited its class's longest wait: a second wait elsewhere would double it; lower the class's
`max_wait_s` to spill sooner), not `rate_limited` (the tenant's limit, the same in every pool), not
upstream failures (retries and continuation handle those), and never a request pinned to a stored
response (only its replica holds that state).

Each fallback pool is tried once, in the configured order, under its own model (the body's `model`
rewritten to it): the fallback list of the first pool is the whole list — a fallback pool's own
`fallback` is not followed, so a cycle cannot form. The answer's `x-gateway-pool` names the pool that
served it; every hand-over counts in `llm_gateway_fallbacks_total{model, fallback, reason}` (the
pool that refused, the pool it went to, the refusal). When the last pool refuses too, its refusal is
the answer. Each pool's admission is a new attempt for the tenant's rate limits: its token estimate
is refunded on a refusal, its request count is not (an attempt counts as a request,
`admission.tenant_gate`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from gateway.base.errors import ErrorCode, GatewayError
from gateway.base.metrics import GatewayMetrics
from gateway.proxy.context import RequestContext
from gateway.proxy.reply import Reply
from gateway.upstream.model_catalog import ServedModel

FALLBACK_CODES = frozenset({ErrorCode.NO_REPLICA, ErrorCode.QUEUE_FULL})
"""The refusals that pass a request to the next pool (module docstring)."""


class Fallback:
    """Runs one request through its pool and, on a refusal in `FALLBACK_CODES`, its fallbacks."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    async def serve(
        self,
        ctx: RequestContext,
        reply: Reply,
        serve: Callable[[RequestContext, Reply], Awaitable[None]],
        fallbacks: Sequence[ServedModel],
        context: Callable[[ServedModel], RequestContext],
    ) -> RequestContext:
        """`serve(ctx, reply)`, then each fallback's context while the refusal allows; the context
        that served (or whose refusal propagates)."""
        remaining = list(fallbacks)
        while True:
            try:
                await serve(ctx, reply)
                return ctx
            except GatewayError as error:
                if not remaining or reply.started or error.code not in FALLBACK_CODES:
                    raise
                served = remaining.pop(0)
                self._metrics.fallbacks_total.labels(ctx.pool.model, served.pool.model, str(error.code)).inc()
                reply.decision = None
                ctx = context(served)
