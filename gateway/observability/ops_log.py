"""Access-log lines for the requests the serve path never sees: the operations routes (`GET /v1/models`,
`/openapi.json`, `/admin/...`), unknown routes (404) and wrong methods on any route (405).

`OpsLog.serve` runs the answering ASGI app with a `send` that notes the status, the reason header and
the request id, and writes one line when the answer is sent, in the access log's field order
(docs/OPERATIONS.md, "Access log"), kept by the same rule as any line (`AccessLog.keeps`: every
refusal, a sample of the rest). Probes and scrapes (`UNLOGGED_PATHS`) get no line: they come every few
seconds and have their own signals. The line's `endpoint` is the path asked for (cut at
`MAX_PATH_CHARS`), `tenant` the name the request's key resolves to (null when it does not); the
serve-path fields are null, empty or 0.
The gateway builds an `OpsLog` only when the access log is on: with it off nothing here runs.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.api.asgi_io import Message, Receive, Scope, Send, header
from gateway.api.request_ids import request_id_of
from gateway.observability.access_log import OUTCOME_SUCCESS, AccessLog
from gateway.observability.request_record import client_trace_id

UNLOGGED_PATHS = frozenset({"/healthz", "/health", "/readyz", "/metrics"})
MAX_PATH_CHARS = 200
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class OpsLog:
    """Writes the lines of requests outside the serve path (module docstring). `tenant_of` names the
    tenant a request's key resolves to, or None."""

    def __init__(self, access_log: AccessLog, tenant_of: Callable[[Scope], str | None]) -> None:
        self._access_log = access_log
        self._tenant_of = tenant_of

    async def serve(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer with `app`; then the request's line, unless its path is a probe's."""
        if scope["path"] in UNLOGGED_PATHS:
            await app(scope, receive, send)
            return
        started_s = time.perf_counter()
        seen: dict[str, Any] = {}

        async def noting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                seen["status"] = message["status"]
                seen["reason"] = headers.get(b"x-gateway-reject-reason")
                seen["request_id"] = headers.get(b"x-request-id")
            await send(message)

        try:
            await app(scope, receive, noting_send)
        finally:
            self._finish(scope, seen, (time.perf_counter() - started_s) * 1000)

    def _finish(self, scope: Scope, seen: dict[str, Any], duration_ms: float) -> None:
        status = seen.get("status")
        reason = seen.get("reason")
        if status is None:  # the app raised before answering: the server answers 500
            outcome, status = "internal_error", 500
        elif reason is not None:
            outcome = reason.decode("latin-1")
        else:
            outcome = OUTCOME_SUCCESS if status < 400 else "error"
        if not self._access_log.keeps(outcome, duration_ms, None, None):
            return
        request_id = seen.get("request_id")
        self._access_log.write(
            {
                "ts": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
                "request_id": request_id.decode("latin-1")
                if request_id
                else request_id_of(header(scope, b"x-request-id")),
                "trace_id": client_trace_id(header(scope, b"traceparent")),
                "tenant": self._tenant_of(scope),
                "model": None,
                "pool": None,
                "endpoint": scope["path"][:MAX_PATH_CHARS],
                "method": scope["method"],
                "stream": None,
                "priority": None,
                "replica": None,
                "replicas_tried": [],
                "route_policy": None,
                "route_branch": None,
                "status": status,
                "outcome": outcome,
                "reason": None if outcome == OUTCOME_SUCCESS else outcome,
                "retries": 0,
                "continuations": 0,
                "queue_ms": 0.0,
                "ttft_ms": None,
                "duration_ms": round(duration_ms, 2),
                "tokens_in": None,
                "tokens_out": None,
                "attribution": [],
            }
        )
