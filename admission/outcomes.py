"""The closed set of admission outcomes, shared by every admission structure and mapped by the gateway.

The pure structures never raise for a refusal: they return values carrying a `RejectReason` and a
Retry-After in seconds. The async `AdmissionController` turns them into one exception,
`AdmissionRefused`, and one place in the gateway maps it to status codes and headers (DESIGN §4):

| reason          | status | Retry-After from                                   |
|-----------------|--------|----------------------------------------------------|
| `rate_limited`  | 429    | token-bucket refill time (`RateLimitResult`)       |
| `queue_full`    | 429    | queue drain time (`retry_after.queue_retry_after_s`)|
| `queue_timeout` | 429    | queue drain time                                   |
| `no_replica`    | 503    | next health probe / breaker half-open              |
| `draining`      | 503    | readiness propagation time                         |
| `state_unavailable` | 503 | how long shared state (Redis) has been unreachable (`fail_closed`) |

A queued request that held out for one resource (`admission.holds`) is no refusal: `HoldOutcome` says
what became of its hold (reported to the observer, counted by the gateway as `prefix_wait_total`).
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
    STATE_UNAVAILABLE = "state_unavailable"


class HoldOutcome(StrEnum):
    """A waiter's hold, reported twice: `HELD` when it first holds out (once, however often it is
    asked again or changes the key it waits for), then how it left the queue. So HELD = OWNER +
    SPILLED + REFUSED + CANCELLED + those holding now."""

    HELD = "held"
    """It declined a free slot to wait for one key (the replica holding its prefix)."""
    OWNER = "owner"
    """Dispatched to the key it held for last (its owner freed a slot in time)."""
    SPILLED = "spilled"
    """Dispatched elsewhere: its hold ran out, or the hook stopped holding (its wait no longer fits)."""
    REFUSED = "refused"
    """Left the queue refused after holding (queue timeout, displaced, draining, an error)."""
    CANCELLED = "cancelled"
    """Its caller left while it was queued after holding."""


class AdmissionRefused(Exception):
    """The one exception of admission refusals (`admission.controller`): `reason` (the reject-reason
    header), `retry_after_s` (integer seconds ≥ 1, always computed), a human `message`, the request's
    `priority` class when known, and `limited_by` for `rate_limited` (`requests`, `tokens`, or
    `concurrency` for the tenant bulkhead) — a detail for logs and messages, not a new reason."""

    def __init__(
        self,
        reason: RejectReason,
        retry_after_s: int,
        message: str,
        *,
        priority: str | None = None,
        limited_by: str | None = None,
    ) -> None:
        if retry_after_s < 1:
            raise ValueError(f"retry_after_s must be an integer ≥ 1 (got {retry_after_s})")
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.message = message
        self.priority = priority
        self.limited_by = limited_by

    def __repr__(self) -> str:
        return f"AdmissionRefused({self.reason}, retry_after_s={self.retry_after_s}, {self.message!r})"
