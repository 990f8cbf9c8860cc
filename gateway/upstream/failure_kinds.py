"""What went wrong on an attempt to a replica (`FailureKind`), as the serve path classifies it
(`gateway.proxy.retry_policy.failure_kind`), and which kinds count against the replica's circuit breaker
(`BREAKER_FAILURES`). Passive health, the breakers, failure attribution, the poison-request evidence
and the metrics all read it; apart from the registry, which only records what it is told.
"""

from __future__ import annotations

from enum import StrEnum


class FailureKind(StrEnum):
    """What went wrong on an attempt; decides passive health and breaker accounting."""

    CONNECT = "connect"
    STATUS_5XX = "status_5xx"
    OVERLOADED = "overloaded"
    TTFT_TIMEOUT = "ttft_timeout"
    STREAM_IDLE = "stream_idle"
    """The replica sent nothing for the idle timeout (silence: load, a sick replica or a poison request)."""
    STREAM_BROKEN = "stream_broken"
    """The replica broke off the stream (reset, early close, bad framing)."""


BREAKER_FAILURES = frozenset(
    {
        FailureKind.CONNECT,
        FailureKind.STATUS_5XX,
        FailureKind.TTFT_TIMEOUT,
        FailureKind.STREAM_IDLE,
        FailureKind.STREAM_BROKEN,
    }
)
"""The kinds that count against the replica's circuit breaker (an engine's 429/503 does not)."""
