"""What shared state does while Redis is unreachable: the failure policy, and the record of outages.

Failure behaviour (`state.on_error`): a call that cannot reach Redis (connection refused or reset,
socket timeout, read-only replica, the call's overall deadline) is answered by the `FailureMode`:
`fail_open` allows, `fail_closed` refuses. The `OutageRecord` counts every such failure
(`errors_total`) and calls `on_error_callback(operation)` (export it as a metric, labelled by
`RedisOperation`); it logs it at most once per `log_interval_s` (default 30 s) with the count of errors
since the last log, and once more when Redis answers again. Shared state is `available` from then on
until the next failure; while it is not, a fail-closed refusal's Retry-After is the outage's age so
far (at least 1 s).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum

from core.clock import Clock
from core.redaction import redact

logger = logging.getLogger(__name__)

DEFAULT_LOG_INTERVAL_S = 30.0


class FailureMode(StrEnum):
    """What a shared-state store answers while its backend (Redis) is unreachable (`state.on_error`)."""

    FAIL_OPEN = "fail_open"
    FAIL_CLOSED = "fail_closed"


class RedisOperation(StrEnum):
    """Which call touched Redis (label of the backend-error metric)."""

    RATE_LIMIT_ACQUIRE = "rate_limit_acquire"
    RATE_LIMIT_RECONCILE = "rate_limit_reconcile"
    LEASE_ACQUIRE = "lease_acquire"
    LEASE_RENEW = "lease_renew"
    LEASE_RELEASE = "lease_release"
    LEASE_COUNT = "lease_count"
    IDEMPOTENCY_CLAIM = "idempotency_claim"
    IDEMPOTENCY_WAIT = "idempotency_wait"
    IDEMPOTENCY_RENEW = "idempotency_renew"
    IDEMPOTENCY_COMPLETE = "idempotency_complete"
    MEMBERSHIP_HEARTBEAT = "membership_heartbeat"
    MEMBERSHIP_LEAVE = "membership_leave"
    QUARANTINE_ADD = "quarantine_add"
    QUARANTINE_SYNC = "quarantine_sync"
    EVIDENCE_ADD = "evidence_add"
    EVIDENCE_CLEAR = "evidence_clear"
    EVIDENCE_SYNC = "evidence_sync"
    RESPONSE_STATE_GET = "response_state_get"
    RESPONSE_STATE_PUT = "response_state_put"
    PREFIX_INDEX_SYNC = "prefix_index_sync"
    LOWEST_CLASS_SYNC = "lowest_class_sync"
    RESPONSE_STATE_DELETE = "response_state_delete"


class OutageRecord:
    """The failures of one backend's calls (see the module docstring); `clock` times the log interval
    and the outage's age."""

    def __init__(
        self,
        on_error: FailureMode,
        clock: Clock,
        *,
        log_interval_s: float = DEFAULT_LOG_INTERVAL_S,
        on_error_callback: Callable[[RedisOperation], None] | None = None,
    ) -> None:
        self._on_error = on_error
        self._clock = clock
        self._log_interval_s = log_interval_s
        self._on_error_callback = on_error_callback
        self.errors_total = 0
        self._errors_since_log = 0
        self._last_log_s: float | None = None
        self._outage_started_s: float | None = None

    @property
    def available(self) -> bool:
        """False from a failed call until the next successful one."""
        return self._outage_started_s is None

    def retry_after_s(self) -> float:
        """How long the outage has lasted so far (≥ 1 s; 1 s when there is none)."""
        if self._outage_started_s is None:
            return 1.0
        return max(1.0, self._clock.now_s() - self._outage_started_s)

    def failed(self, operation: RedisOperation, exc: BaseException) -> None:
        """A call of `operation` could not reach Redis (`exc`): count it, tell the callback, log when due."""
        now_s = self._clock.now_s()
        self.errors_total += 1
        self._errors_since_log += 1
        if self._outage_started_s is None:
            self._outage_started_s = now_s
        if self._on_error_callback is not None:
            self._on_error_callback(operation)
        if self._last_log_s is None or now_s - self._last_log_s >= self._log_interval_s:
            logger.warning(
                "redis unreachable during %s (%s: %s); answering %s; %d error(s) since last report",
                operation,
                type(exc).__name__,
                redact(str(exc)),
                self._on_error,
                self._errors_since_log,
            )
            self._last_log_s = now_s
            self._errors_since_log = 0

    def succeeded(self) -> None:
        """A call reached Redis: an outage, if any, is over (logged)."""
        if self._outage_started_s is not None:
            logger.warning("redis reachable again after %.1f s", self._clock.now_s() - self._outage_started_s)
            self._outage_started_s = None
