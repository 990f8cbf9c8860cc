"""The one exception hierarchy of the gateway. `gateway.base.error_mapping` is the one place that turns it
into HTTP (status, `x-gateway-reject-reason`, `Retry-After`, OpenAI-style body) or a terminal SSE event.

Every shed or failure path raises one of these; nothing else builds an error response.
"""

from __future__ import annotations

import math
from enum import StrEnum

from admission.outcomes import AdmissionRefused, RejectReason
from core.redaction import redact


class ErrorCode(StrEnum):
    """The `x-gateway-reject-reason` values (DESIGN §4) and the body's `error.code`."""

    BAD_REQUEST = "bad_request"
    MODEL_NOT_FOUND = "model_not_found"
    TOO_LARGE = "too_large"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    RATE_LIMITED = "rate_limited"
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    NO_REPLICA = "no_replica"
    DRAINING = "draining"
    STATE_UNAVAILABLE = "state_unavailable"
    UPSTREAM_CONNECT = "upstream_connect"
    UPSTREAM_TTFT_TIMEOUT = "upstream_ttft_timeout"
    UPSTREAM_IDLE_TIMEOUT = "upstream_idle_timeout"
    UPSTREAM_TOTAL_TIMEOUT = "upstream_total_timeout"
    UPSTREAM_STATUS = "upstream_status"
    UPSTREAM_PROTOCOL = "upstream_protocol"
    INTERNAL = "internal_error"
    REQUEST_QUARANTINED = "request_quarantined"
    REQUEST_TIMEOUT = "request_timeout"
    CONNECTION_LIMIT = "connection_limit"
    ENDPOINT_NOT_SERVED = "endpoint_not_served"
    RESPONSE_NOT_FOUND = "response_not_found"
    RESPONSE_STATE_LOST = "response_state_lost"


class GatewayError(Exception):
    """Base of every error the gateway answers with. Subclasses fix status, code and OpenAI type."""

    status: int = 500
    code: ErrorCode = ErrorCode.UPSTREAM_PROTOCOL
    error_type: str = "server_error"

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        message = redact(message)  # no credential in an answer or a log line (`core.redaction`)
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    @property
    def retry_after_header(self) -> str | None:
        """`Retry-After` as integer seconds ≥ 1 (rounded up), or None when not applicable."""
        if self.retry_after_s is None:
            return None
        return str(max(1, math.ceil(self.retry_after_s)))


class BadRequest(GatewayError):
    status = 400
    code = ErrorCode.BAD_REQUEST
    error_type = "invalid_request_error"


class ModelNotFound(GatewayError):
    status = 404
    code = ErrorCode.MODEL_NOT_FOUND
    error_type = "invalid_request_error"


class RouteNotFound(GatewayError):
    status = 404
    code = ErrorCode.NOT_FOUND
    error_type = "invalid_request_error"


class MethodNotAllowed(GatewayError):
    """405, with the `Allow` header RFC 9110 requires: the methods the path does answer."""

    status = 405
    code = ErrorCode.METHOD_NOT_ALLOWED
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, allow: tuple[str, ...]) -> None:
        super().__init__(message)
        self.allow = allow


class EndpointNotServed(GatewayError):
    """The pool's engine does not serve this endpoint (the pool's `endpoints` setting); the message
    names the pool and what it serves."""

    status = 404
    code = ErrorCode.ENDPOINT_NOT_SERVED
    error_type = "invalid_request_error"


class ResponseNotFound(GatewayError):
    """A `/v1/responses/{id}` call or a `previous_response_id` the gateway has no record of (never
    produced through it, or its record expired: `gateway.proxy.stores.response_state`)."""

    status = 404
    code = ErrorCode.RESPONSE_NOT_FOUND
    error_type = "invalid_request_error"


class ResponseStateLost(GatewayError):
    """The replica that holds a stored response (engines keep it in memory) is gone or not routable:
    the state is lost, and sending the request elsewhere would answer without it."""

    status = 404
    code = ErrorCode.RESPONSE_STATE_LOST
    error_type = "invalid_request_error"


class PayloadTooLarge(GatewayError):
    status = 413
    code = ErrorCode.TOO_LARGE
    error_type = "invalid_request_error"


class RequestTimeout(GatewayError):
    """The client did not send the request's headers or body within `server.header_timeout_s` /
    `server.body_timeout_s`; the connection is closed after the answer."""

    status = 408
    code = ErrorCode.REQUEST_TIMEOUT
    error_type = "invalid_request_error"


class Unauthorized(GatewayError):
    status = 401
    code = ErrorCode.UNAUTHORIZED
    error_type = "authentication_error"


class RequestQuarantined(GatewayError):
    """The request broke two replicas (or is identical to one that did, within the quarantine TTL):
    it is not sent anywhere, and a retry fails the same way (no Retry-After)."""

    status = 422
    code = ErrorCode.REQUEST_QUARANTINED
    error_type = "invalid_request_error"


class Overloaded(GatewayError):
    """Base of the 429 shed paths; they always carry a computed Retry-After."""

    status = 429
    error_type = "rate_limit_error"


class RateLimited(Overloaded):
    code = ErrorCode.RATE_LIMITED


class QueueFull(Overloaded):
    code = ErrorCode.QUEUE_FULL


class QueueTimeout(Overloaded):
    code = ErrorCode.QUEUE_TIMEOUT


class Unavailable(GatewayError):
    """Base of the 503 paths."""

    status = 503
    error_type = "service_unavailable"


class NoReplica(Unavailable):
    code = ErrorCode.NO_REPLICA


class Draining(Unavailable):
    code = ErrorCode.DRAINING


class ConnectionLimit(Unavailable):
    """The gateway holds `server.max_connections` client connections; Retry-After is when the next
    idle or half-sent one reaches its header deadline. The connection is closed after the answer."""

    code = ErrorCode.CONNECTION_LIMIT


class StateUnavailable(Unavailable):
    """Shared state (Redis) is unreachable and `state.on_error` is `fail_closed`; Retry-After is the
    outage's age so far."""

    code = ErrorCode.STATE_UNAVAILABLE


class UpstreamError(GatewayError):
    """Base of failures talking to a replica. `replica_id` is set when one was chosen."""

    status = 502
    error_type = "upstream_error"

    def __init__(
        self, message: str, *, replica_id: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.replica_id = replica_id


class UpstreamConnectError(UpstreamError):
    code = ErrorCode.UPSTREAM_CONNECT


class UpstreamProtocolError(UpstreamError):
    """The replica answered something that is not a valid response (closed early, bad framing)."""

    code = ErrorCode.UPSTREAM_PROTOCOL


class UpstreamTimeout(UpstreamError):
    status = 504
    error_type = "timeout"


class UpstreamTTFTTimeout(UpstreamTimeout):
    code = ErrorCode.UPSTREAM_TTFT_TIMEOUT


class UpstreamIdleTimeout(UpstreamTimeout):
    code = ErrorCode.UPSTREAM_IDLE_TIMEOUT


class UpstreamTotalTimeout(UpstreamTimeout):
    code = ErrorCode.UPSTREAM_TOTAL_TIMEOUT


class UpstreamStatusError(UpstreamError):
    """The replica answered an error status; status and body are passed through unchanged."""

    code = ErrorCode.UPSTREAM_STATUS

    def __init__(
        self,
        message: str,
        *,
        status: int,
        body: bytes,
        content_type: str | None,
        replica_id: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, replica_id=replica_id, retry_after_s=retry_after_s)
        self.status = status
        self.body = body
        self.content_type = content_type


class InternalError(GatewayError):
    """A bug: logged with its stack trace and counted; the client still gets a contract answer."""

    status = 500
    code = ErrorCode.INTERNAL
    error_type = "server_error"


_REFUSALS: dict[RejectReason, type[GatewayError]] = {
    RejectReason.RATE_LIMITED: RateLimited,
    RejectReason.QUEUE_FULL: QueueFull,
    RejectReason.QUEUE_TIMEOUT: QueueTimeout,
    RejectReason.NO_REPLICA: NoReplica,
    RejectReason.DRAINING: Draining,
    RejectReason.STATE_UNAVAILABLE: StateUnavailable,
}
"""Every admission outcome and the gateway error that answers it (each error's `code` has the same
value as its reason: tests hold the two enums together)."""


def from_refusal(refused: AdmissionRefused) -> GatewayError:
    """The gateway error for an admission refusal: its class by reason, its message and Retry-After."""
    return _REFUSALS[refused.reason](refused.message, retry_after_s=refused.retry_after_s)
