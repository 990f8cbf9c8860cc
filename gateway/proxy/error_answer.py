"""Answering a request with a `GatewayError`, in the endpoint's API surface (`gateway.base.error_mapping`).

Before the first byte the error is a contract response: its status, headers and body, plus
`x-request-id`, and `x-gateway-pool` / `x-gateway-replica` once known. After it, the stream ends with
the terminal SSE error event. A `draining` error without its own Retry-After gets the drain's
(`draining_retry_after_s`). Every error is counted in `rejections_total{reason}`; a contract response
that was written, in `rejection_duration_seconds{reason}` too (from the request's arrival; a stream's
terminal event is not). A client that left or stopped reading meanwhile simply does not get the answer.
"""

from __future__ import annotations

from admission.retry_after import draining_retry_after_s
from gateway.api.asgi_io import ClientDisconnected, send_response
from gateway.base.error_mapping import to_response, to_sse_event
from gateway.base.errors import Draining, GatewayError
from gateway.base.metrics import GatewayMetrics
from gateway.base.surface import ApiSurface
from gateway.observability.metric_children import Children
from gateway.proxy.relay import finish_body
from gateway.proxy.reply import Reply


class ErrorAnswer:
    """Answers errors (see the module docstring); `readiness_propagation_s` sets the drain's Retry-After."""

    def __init__(self, metrics: GatewayMetrics, readiness_propagation_s: float) -> None:
        self._rejections = Children(metrics.rejections_total)
        self._rejection_seconds = Children(metrics.rejection_duration_seconds)
        self._readiness_propagation_s = readiness_propagation_s

    async def __call__(self, reply: Reply, error: GatewayError, surface: ApiSurface) -> None:
        """Answer `error` (a contract response, or the terminal SSE event after the start)."""
        self._rejections(str(error.code)).inc()
        if isinstance(error, Draining) and error.retry_after_s is None:
            error.retry_after_s = draining_retry_after_s(self._readiness_propagation_s)
        try:
            if reply.started:
                await finish_body(reply, to_sse_event(error, surface))
                return
            answer = to_response(error, surface)
            headers = [*answer.headers, ("x-request-id", reply.request_id)]
            if reply.pool is not None:
                headers.append(("x-gateway-pool", reply.pool))
            if reply.decision is not None:
                headers.append(("x-gateway-replica", reply.decision.replica_id))
            await send_response(reply.send, answer.status, headers, answer.body)
        except ClientDisconnected:
            return
        self._rejection_seconds(str(error.code)).observe(reply.elapsed_s())
