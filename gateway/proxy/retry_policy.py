"""When a failed attempt is retried, and how long to wait first.

Retries happen only before the first byte reached the client, and only when all of these hold:
- the failure is retryable: connect failure, engine 5xx/429/503, first-token deadline, a stream that
  broke before any content (a total-deadline overrun is the request's own length: not retried);
- attempts so far < `retries.max_attempts` (the first try counts);
- the request is not large: prompt + max_tokens (estimated) ≤ `retries.max_retry_tokens`, since
  retrying a long generation can double its cost;
- the pool's retry budget has room (`admission.retry_budget.RetryBudget`: retries ≤ budget_ratio ×
  requests + a floor, over a sliding window), so an overloaded fleet does not get a retry storm.
  A connect failure is the exception: the request never reached an engine, so retrying it elsewhere
  adds no load anywhere, and it is not charged to the budget (max_attempts still bounds it).
The budget bounds these retries only: a broken stream's continuation after the first byte is not a
retry and never draws from it (`gateway.proxy.continuation`), and neither failure attribution nor
quarantine waits for a second try (`gateway.proxy.containment`).
Each retry makes a fresh routing decision with the failed replicas excluded. Backoff is full jitter:
    sleep = uniform(0, min(backoff_max_s, backoff_initial_s × 2^(retry − 1)))
An engine's `Retry-After` is honoured by holding that replica out for that long (registry), not by
sleeping: the retry goes to another replica.
"""

from __future__ import annotations

import random

from admission.retry_budget import RetryBudget
from gateway.base.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamIdleTimeout,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTTFTTimeout,
)
from gateway.config.settings import RetrySettings
from gateway.upstream.failure_kinds import FailureKind
from router.types import RoutingRequest

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
OVERLOAD_STATUSES = frozenset({429, 503})


def failure_kind(error: UpstreamError) -> FailureKind | None:
    """How a failed attempt counts against its replica (None: not the replica's fault). A silent stream
    (idle timeout, `STREAM_IDLE`) is told from a broken one (`STREAM_BROKEN`): silence can be load,
    a break cannot (`gateway.proxy.failure_attribution`)."""
    if isinstance(error, UpstreamConnectError):
        return FailureKind.CONNECT
    if isinstance(error, UpstreamStatusError):
        if error.status in OVERLOAD_STATUSES:
            return FailureKind.OVERLOADED
        return FailureKind.STATUS_5XX if error.status >= 500 else None
    if isinstance(error, UpstreamTTFTTimeout):
        return FailureKind.TTFT_TIMEOUT
    if isinstance(error, UpstreamIdleTimeout):
        return FailureKind.STREAM_IDLE
    if isinstance(error, UpstreamProtocolError):
        return FailureKind.STREAM_BROKEN
    return None


def is_retryable(error: UpstreamError) -> bool:
    if isinstance(error, UpstreamStatusError):
        return error.status in RETRYABLE_STATUSES
    return failure_kind(error) is not None


class RetryPolicy:
    """See the module docstring. One per pool (the budget is per pool)."""

    def __init__(self, settings: RetrySettings, budget: RetryBudget, rng: random.Random) -> None:
        self._settings = settings
        self.budget = budget
        self._rng = rng

    def eligible(self, error: UpstreamError, attempts_made: int, routing: RoutingRequest) -> bool:
        """Retryable kind, attempts left, not too large (the budget is spent separately, by `spend`,
        only once another replica is actually available)."""
        if not is_retryable(error) or attempts_made >= self._settings.max_attempts:
            return False
        return routing.estimated_total_tokens <= self._settings.max_retry_tokens

    def spend(self, error: UpstreamError) -> bool:
        """Take one retry from the budget (connect failures are free); False when it is exhausted."""
        if isinstance(error, UpstreamConnectError):
            return True
        return self.budget.try_spend()

    def backoff_s(self, retry_number: int) -> float:
        s = self._settings
        ceiling_s = min(s.backoff_max_s, s.backoff_initial_s * 2 ** max(0, retry_number - 1))
        return self._rng.uniform(0.0, ceiling_s)
