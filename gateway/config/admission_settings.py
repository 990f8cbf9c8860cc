"""Who may send and in which class (`admission:` and `tenants:` in the config): the priority classes
with their queue waits, the queue's limits and early refusal, the lowest class's reserve, and each
tenant's API keys, rate limits, bulkhead, priority ceiling and fair-share weight. Read into the admission
package's own types by `gateway.proxy.admission_assembly`; validated with the rest of the config by
`gateway.config.settings`; every model forbids unknown keys.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from admission.retry_lane import DEFAULT_HORIZON_S, DEFAULT_SHARE
from gateway.config.strict_model import StrictModel


class PriorityClassSettings(StrictModel):
    """One priority class: how long a request may wait in the queue, and an optional depth of its own."""

    max_wait_s: float = Field(gt=0, allow_inf_nan=False)
    max_depth: int | None = Field(None, ge=1)


def _default_classes() -> dict[str, PriorityClassSettings]:
    return {
        "critical": PriorityClassSettings(max_wait_s=30),
        "interactive": PriorityClassSettings(max_wait_s=10),
        "batch": PriorityClassSettings(max_wait_s=300),
    }


class AdmissionSettings(StrictModel):
    """Priority classes are listed highest priority first (YAML keeps the order). A request's class is
    `x-gateway-priority`, clamped to its tenant's ceiling; `default_priority` when absent or unknown.
    With tenants configured, a request without an API key is refused (401) unless `allow_anonymous`."""

    classes: dict[str, PriorityClassSettings] = Field(default_factory=_default_classes)
    max_queue_depth: int = Field(2000, ge=1)
    early_refusal_ratio: float | None = Field(0.8, gt=0, le=100, allow_inf_nan=False)
    """Refuse at arrival (429 `queue_full`) when the request is not expected to be dispatched within this
    × the class's max wait — by the pool's capacity left to its class and by the release forecast of
    the requests running now (`admission.controller.AdmissionConfig`) — rather than after it; null
    waits the full `max_wait_s` before `queue_timeout`. Default 0.8: the 20 % margin absorbs the jitter
    of a cohort's completion, so under overload a request that will not be served is refused at arrival
    rather than after waiting out its class's limit, at the same goodput
    (docs/bench-log/2026-12-05-rounds.md, "Early refusal by class")."""
    lowest_class_reserve: float = Field(0.1, ge=0, lt=1, allow_inf_nan=False)
    """Trunk reservation: while a class above the lowest (batch) has demand, the lowest class may fill
    only 1 − this of a replica's learned cap (default 0.1: 90 %), so under overload it takes only what
    the classes above leave (`admission.lowest_class_reserve`). 0: every class shares the cap first
    come, first served."""
    retry_lane_share: float = Field(DEFAULT_SHARE, ge=0, le=1, allow_inf_nan=False)
    """The retry lane (`admission.retry_lane`): a `queue_full` or `queue_timeout` refusal books its
    retry a place, its Retry-After says when, and a retry of the same request (tenant, model, prompt,
    max_tokens) that comes back then queues ahead of new arrivals of its class. The lane books at most
    this share of the class's dispatch rate (default 1.0: within the horizon, returning retries first);
    0: off (Retry-After is the queue's estimate, a retry is a new arrival)."""
    retry_lane_horizon_s: float = Field(DEFAULT_HORIZON_S, ge=1, le=3600, allow_inf_nan=False)
    """How far ahead the retry lane books (seconds, default 2): a refusal past it gets the queue's
    Retry-After and no place (a retry told to wait longer has missed its TTFT objective, and places
    further out are taken from new arrivals that can still meet theirs)."""
    default_priority: str = "interactive"
    allow_anonymous: bool = False

    @model_validator(mode="after")
    def _default_is_a_class(self) -> AdmissionSettings:
        if not self.classes:
            raise ValueError("classes: at least one priority class is needed")
        if self.default_priority not in self.classes:
            raise ValueError(f"default_priority {self.default_priority!r} is not one of the classes")
        return self


class TenantSettings(StrictModel):
    """A tenant: API keys as sha256 hex digests (`llm-gateway hash-key`), limits, ceiling and weight."""

    name: str = Field(min_length=1)
    api_key_hashes: list[str] = Field(default_factory=list)
    requests_per_min: float | None = Field(None, gt=0)
    tokens_per_min: float | None = Field(None, gt=0)
    max_concurrent: int | None = Field(None, ge=1)
    priority_ceiling: str | None = None
    weight: float = Field(1.0, gt=0)

    @field_validator("api_key_hashes")
    @classmethod
    def _hex_digests(cls, hashes: list[str]) -> list[str]:
        for value in hashes:
            if len(value) != 64 or any(ch not in "0123456789abcdefABCDEF" for ch in value):
                raise ValueError("each api_key_hashes entry must be a sha256 hex digest (64 hex characters)")
        return [value.lower() for value in hashes]
