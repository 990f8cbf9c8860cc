"""Per-request upstream timers: the pool's defaults, tightened or loosened by request headers within
the configured ceilings.

    x-gateway-ttft-timeout-ms  → ttft_s = clamp(value / 1000, MIN_OVERRIDE_S, timeouts.max_ttft_s)
    x-gateway-idle-timeout-ms  → idle_s = clamp(value / 1000, MIN_OVERRIDE_S, timeouts.max_idle_s)

A header that is not a positive integer is a 400 `bad_request` (a typo should not silently fall back).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.base.errors import BadRequest
from gateway.config.settings import TimeoutSettings

MIN_OVERRIDE_S = 0.05
TTFT_HEADER = "x-gateway-ttft-timeout-ms"
IDLE_HEADER = "x-gateway-idle-timeout-ms"


@dataclass(frozen=True, slots=True)
class RequestTimers:
    connect_s: float
    ttft_s: float
    idle_s: float
    total_s: float | None
    nonstream_s: float


def milliseconds_header_s(name: str, raw: str) -> float:
    """A header holding a positive integer number of milliseconds, in seconds; 400 `bad_request`
    naming the header otherwise."""
    try:
        value_ms = int(raw)
    except ValueError:
        value_ms = -1
    if value_ms <= 0:
        raise BadRequest(f"header {name} must be a positive integer number of milliseconds")
    return value_ms / 1000.0


def _override_s(name: str, raw: str | None, default_s: float, ceiling_s: float) -> float:
    if raw is None:
        return default_s
    return min(ceiling_s, max(MIN_OVERRIDE_S, milliseconds_header_s(name, raw)))


def request_timers(
    timeouts: TimeoutSettings, ttft_header: str | None, idle_header: str | None
) -> RequestTimers:
    return RequestTimers(
        connect_s=timeouts.connect_s,
        ttft_s=_override_s(TTFT_HEADER, ttft_header, timeouts.ttft_s, timeouts.max_ttft_s),
        idle_s=_override_s(IDLE_HEADER, idle_header, timeouts.idle_s, timeouts.max_idle_s),
        total_s=timeouts.total_s,
        nonstream_s=timeouts.nonstream_s,
    )
