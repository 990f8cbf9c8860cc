"""Account one finished request: outcome, duration, TTFT, TPOT, tokens and goodput, once, at its end.

The handler calls `RequestAccounting.record` in `finally` for every request, whatever its outcome
(the slot and tenant pass are released by the ticket, not here: this is the metrics side):
- `requests_total{model,outcome}` (and per tenant) always — `model` is `unknown` when the request
  never reached a pool (unparsable body, unknown model);
- `request_duration_seconds{model}` for requests that reached a pool;
- on success only: `ttft_seconds` (the reply's first output: first content event of a stream, the
  whole body of a non-streamed response), `tokens_total{direction}` from the engine's usage, and for
  streams with more than one output token `tpot_seconds = (e2e − TTFT) / (completion_tokens − 1)`;
- goodput (`goodput_requests_total`, `goodput_tokens_total`) when the request met its pool's SLO
  (`met_slo`); `slo_requests_total` counts every request the test ran on (the latency SLO's total).

The request's `RequestRecord` (`gateway.observability`) is finished first: its server span ends and its
access-log line is written (or sampled out). A sampled trace's ids ride on the duration and TTFT
observations as exemplars (shown to OpenMetrics scrapes only: `/metrics` negotiates the format).
"""

from __future__ import annotations

from typing import Any

from gateway.metrics import GatewayMetrics
from gateway.observability.request_record import NO_RECORD, RequestRecord
from gateway.proxy.reply import Reply
from gateway.settings import SloSettings
from gateway.upstream.registry import Pool

OUTCOME_SUCCESS = "success"
OUTCOME_CLIENT_DISCONNECT = "client_disconnect"
UNKNOWN_MODEL_LABEL = "unknown"


class RequestAccounting:
    """Per-request metrics at the end of a request (see the module docstring)."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    def record(
        self,
        reply: Reply,
        outcome: str,
        *,
        tenant: str | None,
        pool: Pool | None,
        stream: bool,
        request_record: RequestRecord = NO_RECORD,
    ) -> None:
        """Count a request that ended with `outcome`; `pool` is None when it never reached one."""
        request_record.finish(reply, outcome, tenant)
        exemplar = request_record.exemplar()
        m = self._metrics
        model = pool.model if pool is not None else UNKNOWN_MODEL_LABEL
        m.requests_total.labels(model, outcome).inc()
        if tenant is not None:
            m.tenant_requests_total.labels(tenant, outcome).inc()
        if pool is None:
            return
        elapsed_s = reply.elapsed_s()
        m.request_duration_seconds.labels(model).observe(elapsed_s, exemplar)
        if outcome != OUTCOME_SUCCESS or reply.first_output_s is None:
            return
        m.ttft_seconds.labels(model).observe(reply.first_output_s, exemplar)
        usage = reply.usage or {}
        self._record_tokens(tenant, usage)
        completion_tokens = usage.get("completion_tokens")
        if not isinstance(completion_tokens, int):
            return
        tpot_s = None
        if stream and completion_tokens > 1:
            tpot_s = (elapsed_s - reply.first_output_s) / (completion_tokens - 1)
            m.tpot_seconds.labels(model).observe(tpot_s)
        m.slo_requests_total.labels(model).inc()
        if met_slo(
            pool.settings.slo,
            ttft_s=reply.first_output_s,
            tpot_s=tpot_s,
            e2e_s=elapsed_s,
            completion_tokens=completion_tokens,
            streamed=stream,
        ):
            m.goodput_requests_total.labels(model).inc()
            m.goodput_tokens_total.labels(model).inc(completion_tokens)

    def _record_tokens(self, tenant: str | None, usage: dict[str, Any]) -> None:
        m = self._metrics
        for direction, key in (("input", "prompt_tokens"), ("output", "completion_tokens")):
            count = usage.get(key)
            if isinstance(count, int):
                m.tokens_total.labels(direction).inc(count)
                if tenant is not None:
                    m.tenant_tokens_total.labels(tenant, direction).inc(count)


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
