"""The serve path's metrics: a subscriber of its event port (`gateway.observability.events`).

Per event:
- `retried`: `retries_total{reason}`; `continued`: `stream_continuations_total{model}`; `charged`:
  `upstream_failures_total{model,cause,kind}` (the set's pool: `<model>/prefill` for a prefill replica);
- `finished` (the handler, for every request, whatever its outcome):
  - `requests_total{model,outcome}` (and per tenant) always — `model` is `unknown` when the request
    never reached a pool (unparsable body, unknown model);
  - `request_duration_seconds{model}` for requests that reached a pool;
  - on success only: `ttft_seconds` (the reply's first output: first content event of a stream, the
    whole body of a non-streamed response), `tokens_total{direction}` from the engine's usage, and for
    streams with more than one output token `tpot_seconds = (e2e − TTFT) / (completion_tokens − 1)`;
  - goodput (`goodput_requests_total`, `goodput_tokens_total`) when the request met its pool's SLO
    (`met_slo`); `slo_requests_total` counts every request the test ran on (the latency SLO's total).

A sampled trace's ids ride on the duration and TTFT observations as exemplars (shown to OpenMetrics
scrapes only: `/metrics` negotiates the format). Each metric child (`.labels(...)`) is resolved once
per label values — per pool, outcome, reason, tenant — and kept, not per request
(`gateway.observability.metric_children`).
"""

from __future__ import annotations

from typing import Any

from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import SloSettings
from gateway.observability.events import ServeEventSink
from gateway.observability.metric_children import Children
from gateway.observability.request_record import NO_RECORD, RequestRecord
from gateway.proxy.context import RequestContext
from gateway.proxy.failure_charges import Charge
from gateway.proxy.reply import Reply
from gateway.upstream.registry import Pool

OUTCOME_SUCCESS = "success"
OUTCOME_CLIENT_DISCONNECT = "client_disconnect"
UNKNOWN_MODEL_LABEL = "unknown"


class ServeMetrics(ServeEventSink):
    """The serve path's metrics (module docstring); one per app."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        m = metrics
        self._retries = Children(m.retries_total)
        self._continuations = Children(m.stream_continuations_total)
        self._failures = Children(m.upstream_failures_total)
        self._requests = Children(m.requests_total)
        self._tenant_requests = Children(m.tenant_requests_total)
        self._duration = Children(m.request_duration_seconds)
        self._ttft = Children(m.ttft_seconds)
        self._tpot = Children(m.tpot_seconds)
        self._slo_requests = Children(m.slo_requests_total)
        self._goodput_requests = Children(m.goodput_requests_total)
        self._goodput_tokens = Children(m.goodput_tokens_total)
        self._tokens = Children(m.tokens_total)
        self._tenant_tokens = Children(m.tenant_tokens_total)

    def retried(self, ctx: RequestContext, reason: str) -> None:
        self._retries(reason).inc()

    def continued(self, ctx: RequestContext) -> None:
        self._continuations(ctx.model).inc()

    def charged(self, ctx: RequestContext, pool: Pool, charge: Charge) -> None:
        kind = "none" if charge.kind is None else str(charge.kind)
        self._failures(pool.model, str(charge.cause), kind).inc()

    def finished(
        self,
        reply: Reply,
        outcome: str,
        *,
        tenant: str | None,
        pool: Pool | None,
        stream: bool,
        record: RequestRecord = NO_RECORD,
    ) -> None:
        """Count a request that ended with `outcome`; `pool` is None when it never reached one."""
        model = pool.model if pool is not None else UNKNOWN_MODEL_LABEL
        self._requests(model, outcome).inc()
        if tenant is not None:
            self._tenant_requests(tenant, outcome).inc()
        if pool is None:
            return
        exemplar = record.exemplar()
        elapsed_s = reply.elapsed_s()
        self._duration(model).observe(elapsed_s, exemplar)
        if outcome != OUTCOME_SUCCESS or reply.first_output_s is None:
            return
        self._ttft(model).observe(reply.first_output_s, exemplar)
        usage = reply.usage or {}
        self._count_tokens(tenant, usage)
        completion_tokens = usage.get("completion_tokens")
        if not isinstance(completion_tokens, int):
            return
        tpot_s = None
        if stream and completion_tokens > 1:
            tpot_s = (elapsed_s - reply.first_output_s) / (completion_tokens - 1)
            self._tpot(model).observe(tpot_s)
        self._slo_requests(model).inc()
        if met_slo(
            pool.settings.slo,
            ttft_s=reply.first_output_s,
            tpot_s=tpot_s,
            e2e_s=elapsed_s,
            completion_tokens=completion_tokens,
            streamed=stream,
        ):
            self._goodput_requests(model).inc()
            self._goodput_tokens(model).inc(completion_tokens)

    def _count_tokens(self, tenant: str | None, usage: dict[str, Any]) -> None:
        for direction, key in (("input", "prompt_tokens"), ("output", "completion_tokens")):
            count = usage.get(key)
            if isinstance(count, int):
                self._tokens(direction).inc(count)
                if tenant is not None:
                    self._tenant_tokens(tenant, direction).inc(count)


def met_slo(
    slo: SloSettings,
    *,
    ttft_s: float,
    tpot_s: float | None,
    e2e_s: float,
    completion_tokens: int,
    streamed: bool,
) -> bool:
    """Goodput test. Streams: TTFT ≤ slo.ttft_s and TPOT ≤ slo.tpot_s. A non-streamed response shows
    neither, so it counts when it arrived within the time a stream meeting both would have finished:
    e2e ≤ slo.ttft_s + slo.tpot_s × (completion_tokens − 1)."""
    if streamed:
        ttft_ok = slo.ttft_s is None or ttft_s <= slo.ttft_s
        return ttft_ok and (slo.tpot_s is None or tpot_s is None or tpot_s <= slo.tpot_s)
    if slo.ttft_s is None:
        return True
    return e2e_s <= slo.ttft_s + (slo.tpot_s or 0.0) * max(0, completion_tokens - 1)
