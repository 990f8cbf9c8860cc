"""What failure attribution (`gateway.proxy.failure_attribution`) decides about a failed attempt: the
cause it is charged to (`FailureCause`: replica, request or load), the charge itself (`Charge`: replica,
kind, cause), what the serve loop does with it (`Verdict`: charges to account now, whether to
quarantine the request, whether it waits), and a failure whose cause waits for the request's end
(`Pending`). Apart from the rules because the serve loop, the accounting, the event port and the
containment read these records without the rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gateway.upstream.failure_kinds import FailureKind
from gateway.upstream.registry import Pool
from gateway.upstream.replica import Replica


class FailureCause(StrEnum):
    """What a failed attempt is charged to (a label of `llm_gateway_upstream_failures_total`)."""

    REPLICA = "replica"
    REQUEST = "request"
    LOAD = "load"


@dataclass(frozen=True, slots=True)
class Charge:
    """One failed attempt, charged: the replica it ran on, its kind, its cause."""

    replica: Replica
    kind: FailureKind | None
    cause: FailureCause


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the serve loop does with a failed attempt: `charges` to account now (possibly an earlier
    pending attempt too) and whether the request is a poison request (`quarantine`)."""

    charges: tuple[Charge, ...] = ()
    quarantine: bool = False
    pending: bool = False
    """The failure waits for the request's end (`RequestFailures.settle`)."""


@dataclass(slots=True)
class Pending:
    """A failed attempt whose cause waits for the request's end (or, held, for the containment's verdict)."""

    replica: Replica
    pool: Pool
    kind: FailureKind
    failed_at_s: float
    default: FailureCause
