"""The closed set of admission outcomes, shared by every admission structure and mapped by the gateway.

Admission never raises for a refusal: it returns values carrying a `RejectReason` and a Retry-After in
seconds, and one place in the gateway maps them to status codes and headers (DESIGN §4):

| reason          | status | Retry-After from                                   |
|-----------------|--------|----------------------------------------------------|
| `rate_limited`  | 429    | token-bucket refill time (`RateLimitResult`)       |
| `queue_full`    | 429    | queue drain time (`retry_after.queue_retry_after_s`)|
| `queue_timeout` | 429    | queue drain time                                   |
| `no_replica`    | 503    | next health probe / breaker half-open              |
| `draining`      | 503    | readiness propagation time                         |
"""

from __future__ import annotations

from enum import StrEnum


class RejectReason(StrEnum):
    """Value of the `x-gateway-reject-reason` header for admission refusals (DESIGN §4)."""

    RATE_LIMITED = "rate_limited"
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    NO_REPLICA = "no_replica"
    DRAINING = "draining"


class FailureMode(StrEnum):
    """What a shared-state store answers while its backend (Redis) is unreachable (`state.on_error`)."""

    FAIL_OPEN = "fail_open"
    FAIL_CLOSED = "fail_closed"
