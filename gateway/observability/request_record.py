"""What one request leaves behind besides metrics: its access-log line and (when tracing) its spans.

The serve path's events reach the hooks of `RequestRecord` through the event port
(`gateway.observability.events`, the record sink of `gateway.observability.record_events`): admission,
each attempt and its route decision, relay, retries, continuations, charges, the failure, the end. The
parsed body and the context (`request_parsed`, `bind`) and the relay's per-chunk hooks (`first_token`,
`finish_reason`, `upstream_headers`) are called on the record directly. Three kinds:
- `RequestRecord` itself (`NO_RECORD`, one shared instance): every hook does nothing — the serve path
  with tracing and access log off;
- `LoggedRecord`: keeps the facts of the access-log line (`gateway.observability.access_log`):
  replicas tried, retries, continuations, the last failure, the status;
- `TracedRecord` (`gateway.observability.request_spans`): the same, plus the spans.

Nothing here reads the prompt, the completion or an API key: only names, counts and timings.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.base.error_mapping import error_statuses
from gateway.base.errors import GatewayError, UpstreamError, UpstreamStatusError
from gateway.observability.access_log import OUTCOME_SUCCESS, AccessLog

if TYPE_CHECKING:
    from gateway.api.request_parsing import ParsedRequest
    from gateway.proxy.context import RequestContext
    from gateway.proxy.reply import Reply
    from gateway.upstream.slot import Slot

OUTCOME_CLIENT_DISCONNECT = "client_disconnect"
CLIENT_CLOSED_STATUS = 499
"""The access log's status of a request whose client left before its answer was sent (nginx's 499)."""
STALE_CONNECTION = "stale_connection"


class RequestRecord:
    """The hooks, doing nothing (see the module docstring)."""

    __slots__ = ()

    collects_finish_reasons = False
    """Whether the relay should look for `finish_reason` in the answer (only spans report it)."""

    def request_parsed(self, parsed: ParsedRequest) -> None:
        """The body is parsed (model, stream known): a refusal before the context is built still
        names them."""

    def bind(self, ctx: RequestContext) -> None:
        """The request's context is built (model, pool, class known)."""

    def admission_started(self, queue_depth: Callable[[], int]) -> None:
        """Admission begins; `queue_depth()` is the pool's queue length now."""

    def admission_ended(self, queue_wait_s: float | None, error: GatewayError | None = None) -> None:
        """Admission dispatched the request after `queue_wait_s`, or refused it with `error`."""

    def attempt_started(self, number: int, slot: Slot) -> None:
        """Try `number` goes to `slot`'s replica (a new slot is a new routing decision)."""

    def upstream_headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        """The headers of the current try (with its `traceparent` when tracing)."""
        return headers

    def attempt_ended(self, failure: BaseException | None) -> None:
        """The current try ended: served (None), or `failure` (an upstream error, a stale connection)."""

    def relay_started(self) -> None:
        """The replica answered 2xx; relaying it to the client begins."""

    def first_token(self, ttft_s: float | None) -> None:
        """The client's first output (`Reply.first_output_s`) went out (a continuation's first output
        calls it again: only the first call counts)."""

    def finish_reason(self, reason: str) -> None:
        """The engine's `finish_reason` of a choice."""

    def retried(self, reason: str) -> None:
        """Another try follows a failure before the first byte (`reason`: the failure kind)."""

    def continued(self) -> None:
        """A broken stream continues on another replica."""

    def failure_charged(self, replica_id: str, kind: str, cause: str) -> None:
        """A failed try on `replica_id` was charged to `cause` (`replica`, `request` or `load`;
        `gateway.proxy.failure_attribution`), `kind` its failure kind (`none` for an engine 4xx)."""

    def failed(self, error: GatewayError) -> None:
        """The serve path ends with `error` (answered by the handler)."""

    def exemplar(self) -> dict[str, str] | None:
        """The trace id of a sampled request, for histogram exemplars; None otherwise."""
        return None

    def finish(self, reply: Reply, outcome: str, tenant: str | None) -> None:
        """The request ended with `outcome` (called once, by accounting, after the answer)."""


NO_RECORD = RequestRecord()


class LoggedRecord(RequestRecord):
    """Keeps the facts of the request's access-log line (see the module docstring)."""

    __slots__ = (
        "_access_log",
        "_ctx",
        "_endpoint",
        "_error_status",
        "_method",
        "_parsed",
        "_reason",
        "charges",
        "continuations",
        "replicas",
        "request_id",
        "retries",
        "trace_id",
    )

    _statuses = {str(code): status for code, status in error_statuses().items()}
    """Reason → the status its error answers with, own or inherited (an `upstream_status` failure records
    the engine's own status instead: `failed`)."""

    def __init__(
        self,
        access_log: AccessLog | None,
        request_id: str,
        trace_id: str | None,
        endpoint: str | None = None,
        method: str | None = None,
    ) -> None:
        self._access_log = access_log
        self.request_id = request_id
        self.trace_id = trace_id
        self._endpoint = endpoint
        self._method = method
        self._parsed: ParsedRequest | None = None
        self.charges: list[dict[str, str]] = []
        self._ctx: RequestContext | None = None
        self.replicas: list[str] = []
        self.retries = 0
        self.continuations = 0
        self._reason: str | None = None
        self._error_status: int | None = None

    def request_parsed(self, parsed: ParsedRequest) -> None:
        self._parsed = parsed

    def bind(self, ctx: RequestContext) -> None:
        self._ctx = ctx
        self._parsed = ctx.parsed

    def attempt_started(self, number: int, slot: Slot) -> None:
        self.replicas.append(slot.replica.replica_id)

    def attempt_ended(self, failure: BaseException | None) -> None:
        if isinstance(failure, GatewayError):
            self._reason = str(failure.code)
        elif failure is not None:
            self._reason = STALE_CONNECTION

    def retried(self, reason: str) -> None:
        self.retries += 1

    def continued(self) -> None:
        self.continuations += 1

    def failure_charged(self, replica_id: str, kind: str, cause: str) -> None:
        self.charges.append({"replica": replica_id, "kind": kind, "cause": cause})

    def failed(self, error: GatewayError) -> None:
        if isinstance(error, UpstreamStatusError):
            self._error_status = error.status
        if isinstance(error, UpstreamError) or self._reason is None:
            self._reason = str(error.code)

    def status(self, reply: Reply, outcome: str) -> int:
        """The HTTP status the client got (a started response: 200, whatever ended it)."""
        if reply.started:
            return 200
        if outcome == OUTCOME_CLIENT_DISCONNECT:
            return CLIENT_CLOSED_STATUS
        if self._error_status is not None:
            return self._error_status
        return self._statuses.get(outcome, 500)

    def finish(self, reply: Reply, outcome: str, tenant: str | None) -> None:
        log = self._access_log
        if log is None:
            return
        duration_ms = reply.elapsed_s() * 1000
        ttft_ms = None if reply.first_output_s is None else reply.first_output_s * 1000
        ctx = self._ctx
        slo_ttft_s = None if ctx is None else ctx.pool.settings.slo.ttft_s
        slo_ttft_ms = None if slo_ttft_s is None else slo_ttft_s * 1000
        if log.keeps(outcome, duration_ms, ttft_ms, slo_ttft_ms):
            log.write(self.line(reply, outcome, tenant, duration_ms, ttft_ms))

    def line(
        self, reply: Reply, outcome: str, tenant: str | None, duration_ms: float, ttft_ms: float | None
    ) -> dict[str, Any]:
        """The access-log fields (docs/OPERATIONS.md, "Access log")."""
        ctx, parsed = self._ctx, self._parsed
        usage = reply.usage or {}
        decision = reply.decision
        return {
            "ts": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "tenant": tenant,
            "model": None if parsed is None else parsed.model,
            "pool": None if ctx is None else ctx.pool.model,
            "endpoint": self._endpoint if parsed is None else parsed.endpoint.value,
            "method": self._method if parsed is None else parsed.method,
            "stream": None if parsed is None else parsed.stream,
            "priority": None if ctx is None else ctx.priority,
            "replica": None if decision is None else decision.replica_id,
            "replicas_tried": self.replicas,
            "route_policy": None if decision is None else decision.policy,
            "route_branch": None if decision is None else str(decision.branch),
            "status": self.status(reply, outcome),
            "outcome": outcome,
            "reason": None if outcome == OUTCOME_SUCCESS else self._reason or outcome,
            "retries": self.retries,
            "continuations": self.continuations,
            "queue_ms": _round(reply.queue_wait_s * 1000),
            "ttft_ms": None if ttft_ms is None else _round(ttft_ms),
            "duration_ms": _round(duration_ms),
            "tokens_in": _int_or_none(usage.get("prompt_tokens")),
            "tokens_out": _int_or_none(usage.get("completion_tokens")),
            "attribution": self.charges,
        }


def _round(value: float) -> float:
    return round(value, 2)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def client_trace_id(traceparent: str | None) -> str | None:
    """The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), or None when malformed."""
    if traceparent is None:
        return None
    parts = traceparent.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return None
    try:
        int(parts[1], 16)
    except ValueError:
        return None
    return parts[1].lower()
