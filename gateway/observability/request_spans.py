"""`TracedRecord`: a request's access-log facts (`LoggedRecord`) plus its OpenTelemetry spans.

    <op> <model>                SERVER  arrival → answer sent; GenAI attributes, status, outcome
    ├── gateway.admission       INTERNAL  class, queue depth at arrival, wait (or the refusal)
    ├── gateway.route           INTERNAL  one per routing decision: policy, branch, replica, prefix blocks
    ├── <op> <upstream model>   CLIENT  one per upstream try: replica, server.address/port, outcome,
    │   │                               error.type of a failure; its context goes upstream as `traceparent`
    │   └── gateway.relay       INTERNAL  relaying the replica's answer to the client
    └── (event) first_token     on the server span, with the TTFT

Children get their parent explicitly (no context variables are touched). A request whose trace is not
sampled still sends a `traceparent` upstream (sampled flag 0), so the engine follows the decision.
A failure sets the span status to ERROR with `error.type` = the gateway's error code (or
`stale_connection`); exception messages are not recorded. The server span is an error for 5xx answers
and for streams ended by a terminal error event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from gateway.base.errors import GatewayError
from gateway.observability import genai
from gateway.observability.access_log import OUTCOME_SUCCESS, AccessLog
from gateway.observability.request_record import STALE_CONNECTION, LoggedRecord

if TYPE_CHECKING:
    from gateway.proxy.context import RequestContext
    from gateway.proxy.reply import Reply
    from gateway.upstream.slot import Slot
    from router.types import Decision

_USAGE_ATTRIBUTES = (
    ("prompt_tokens", genai.USAGE_INPUT_TOKENS),
    ("completion_tokens", genai.USAGE_OUTPUT_TOKENS),
)


class TracedRecord(LoggedRecord):
    """Spans of one request (module docstring)."""

    __slots__ = (
        "_admission",
        "_attempt",
        "_decision",
        "_finish_reasons",
        "_first_seen",
        "_operation",
        "_parent",
        "_provider",
        "_relay",
        "_span",
        "_tracer",
        "_upstream_model",
    )

    collects_finish_reasons = True

    def __init__(  # noqa: PLR0917 - the record's parts, as `LoggedRecord` takes them
        self,
        tracer: Tracer,
        span: Span,
        access_log: AccessLog | None,
        request_id: str,
        endpoint: str | None = None,
        method: str | None = None,
    ) -> None:
        context = span.get_span_context()
        trace_id = f"{context.trace_id:032x}" if context.is_valid else None
        super().__init__(access_log, request_id, trace_id, endpoint, method)
        self._tracer = tracer
        self._span = span
        self._parent = set_span_in_context(span)
        self._admission: Span | None = None
        self._attempt: Span | None = None
        self._relay: Span | None = None
        self._decision: Decision | None = None
        self._finish_reasons: list[str] = []
        self._first_seen = False
        self._operation = "request"
        self._upstream_model = ""
        self._provider = ""

    def _child(self, name: str, kind: SpanKind = SpanKind.INTERNAL, parent: Span | None = None) -> Span:
        context = self._parent if parent is None else set_span_in_context(parent)
        return self._tracer.start_span(name, context=context, kind=kind)

    def bind(self, ctx: RequestContext) -> None:
        super().bind(ctx)
        parsed, pool = ctx.parsed, ctx.pool
        self._operation = genai.operation_name(parsed.endpoint)
        self._upstream_model = ctx.upstream_model or pool.settings.upstream_model or pool.model
        self._provider = str(pool.settings.engine)
        span = self._span
        if not span.is_recording():
            return
        span.update_name(f"{self._operation} {parsed.model}")
        span.set_attribute(genai.OPERATION, self._operation)
        span.set_attribute(genai.PROVIDER, self._provider)
        span.set_attribute(genai.REQUEST_MODEL, parsed.model)
        if parsed.max_tokens is not None:
            span.set_attribute(genai.REQUEST_MAX_TOKENS, parsed.max_tokens)
        span.set_attribute(genai.POOL, pool.model)
        span.set_attribute(genai.PRIORITY, ctx.priority)
        span.set_attribute(genai.STREAM, ctx.stream)
        span.set_attribute(genai.TENANT, ctx.tenant.name)

    def admission_started(self, queue_depth: Callable[[], int]) -> None:
        span = self._admission = self._child("gateway.admission")
        if span.is_recording() and self._ctx is not None:
            span.set_attribute(genai.PRIORITY, self._ctx.priority)
            span.set_attribute(genai.QUEUE_DEPTH, queue_depth())

    def admission_ended(self, queue_wait_s: float | None, error: GatewayError | None = None) -> None:
        span, self._admission = self._admission, None
        if span is None:
            return
        if queue_wait_s is not None:
            span.set_attribute(genai.QUEUE_WAIT_MS, queue_wait_s * 1000)
        if error is not None:
            _fail(span, str(error.code))
        span.end()

    def attempt_started(self, number: int, slot: Slot) -> None:
        super().attempt_started(number, slot)
        decision = slot.decision
        if decision is not self._decision:
            self._decision = decision
            self._route(decision, number)
        span = self._attempt = self._child(f"{self._operation} {self._upstream_model}", SpanKind.CLIENT)
        if not span.is_recording():
            return
        replica = slot.replica
        span.set_attribute(genai.OPERATION, self._operation)
        span.set_attribute(genai.PROVIDER, self._provider)
        span.set_attribute(genai.REQUEST_MODEL, self._upstream_model)
        span.set_attribute(genai.REPLICA, replica.replica_id)
        span.set_attribute(genai.ATTEMPT, number)
        address = urlsplit(replica.url)
        if address.hostname:
            span.set_attribute(genai.SERVER_ADDRESS, address.hostname)
        if address.port:
            span.set_attribute(genai.SERVER_PORT, address.port)

    def _route(self, decision: Decision, number: int) -> None:
        span = self._child("gateway.route")
        if span.is_recording():
            span.set_attribute(genai.ROUTE_POLICY, decision.policy)
            span.set_attribute(genai.ROUTE_BRANCH, str(decision.branch))
            span.set_attribute(genai.REPLICA, decision.replica_id)
            span.set_attribute(genai.ROUTE_HOPS, decision.detail.get("hops", 0))
            span.set_attribute(genai.ROUTE_CANDIDATES, decision.candidates)
            span.set_attribute(genai.ATTEMPT, number)
            matched = decision.detail.get("matched_prefix_blocks")
            if matched is not None:
                span.set_attribute(genai.ROUTE_PREFIX_BLOCKS, matched)
        span.end()

    def upstream_headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        span = self._attempt
        if span is None:
            return headers
        context = span.get_span_context()
        if not context.is_valid:
            return headers
        out = dict(headers)
        out["traceparent"] = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        state = context.trace_state.to_header()
        if state:
            out["tracestate"] = state
        else:
            out.pop("tracestate", None)
        return out

    def attempt_ended(self, failure: BaseException | None) -> None:
        super().attempt_ended(failure)
        self._end_relay(failure)
        span, self._attempt = self._attempt, None
        if span is None:
            return
        if failure is None:
            span.set_attribute(genai.ATTEMPT_OUTCOME, "ok")
        else:
            code = str(failure.code) if isinstance(failure, GatewayError) else STALE_CONNECTION
            span.set_attribute(genai.ATTEMPT_OUTCOME, "failed")
            _fail(span, code)
        span.end()

    def relay_started(self) -> None:
        self._relay = self._child("gateway.relay", parent=self._attempt)

    def _end_relay(self, failure: BaseException | None) -> None:
        span, self._relay = self._relay, None
        if span is None:
            return
        if isinstance(failure, GatewayError):
            _fail(span, str(failure.code))
        span.end()

    def first_token(self, ttft_s: float | None) -> None:
        if ttft_s is not None and not self._first_seen:
            self._first_seen = True
            self._span.add_event("first_token", {genai.TTFT_MS: ttft_s * 1000})

    def finish_reason(self, reason: str) -> None:
        if reason not in self._finish_reasons:
            self._finish_reasons.append(reason)

    def exemplar(self) -> dict[str, str] | None:
        context = self._span.get_span_context()
        if not context.trace_flags.sampled:
            return None
        return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}

    def finish(self, reply: Reply, outcome: str, tenant: str | None) -> None:
        super().finish(reply, outcome, tenant)
        for dangling in (self._admission, self._relay, self._attempt):
            if dangling is not None:  # a cancelled request: close what it had open
                dangling.end()
        self._admission = self._relay = self._attempt = None
        span = self._span
        if span.is_recording():
            self._describe_end(span, reply, outcome, tenant)
        span.end()

    def _describe_end(self, span: Span, reply: Reply, outcome: str, tenant: str | None) -> None:
        status = self.status(reply, outcome)
        span.set_attribute(genai.HTTP_STATUS, status)
        span.set_attribute(genai.OUTCOME, outcome)
        span.set_attribute(genai.RETRIES, self.retries)
        span.set_attribute(genai.CONTINUATIONS, self.continuations)
        span.set_attribute(genai.QUEUE_WAIT_MS, reply.queue_wait_s * 1000)
        if tenant is not None and self._ctx is None:
            span.set_attribute(genai.TENANT, tenant)
        if reply.first_output_s is not None:
            span.set_attribute(genai.TTFT_MS, reply.first_output_s * 1000)
        usage = reply.usage or {}
        for key, name in _USAGE_ATTRIBUTES:
            count = usage.get(key)
            if isinstance(count, int):
                span.set_attribute(name, count)
        if self._finish_reasons:
            span.set_attribute(genai.RESPONSE_FINISH_REASONS, tuple(self._finish_reasons))
        if outcome != OUTCOME_SUCCESS:
            span.set_attribute(genai.ERROR_TYPE, outcome)
            if status >= 500 or reply.started:
                span.set_status(Status(StatusCode.ERROR, outcome))


def _fail(span: Span, code: str) -> None:
    span.set_attribute(genai.ERROR_TYPE, code)
    span.set_status(Status(StatusCode.ERROR, code))
