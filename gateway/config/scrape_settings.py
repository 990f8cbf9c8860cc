"""A pool's engine-load scraping settings (`pools[].scrape`); what the scraper does with them is
`gateway.upstream.scraper`'s docstring."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class OnStale(StrEnum):
    SATURATED = "saturated"
    IGNORE = "ignore"


class ScrapeSettings(BaseModel):
    """Scraping options of one pool (`pools[].scrape`). Defaults: poll every 0.5 s, 0.4 s timeout,
    stale after 3 × interval (1.5 s), stale replicas treated as saturated. `enabled: false` (or engine
    `openai`) means no scraper for the pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    interval_s: float = Field(0.5, gt=0)
    timeout_s: float = Field(0.4, gt=0)
    stale_after_s: float | None = Field(None, gt=0)
    on_stale: OnStale = OnStale.SATURATED
    saturated_waiting_requests: float = Field(64.0, ge=0)
    path: str = Field("/metrics", pattern=r"^/")

    @model_validator(mode="after")
    def _bounds(self) -> ScrapeSettings:
        if self.timeout_s >= self.interval_s:
            raise ValueError(
                f"timeout_s ({self.timeout_s}) must be shorter than interval_s ({self.interval_s})"
            )
        if self.stale_after_s is not None and self.stale_after_s < self.interval_s:
            raise ValueError(f"stale_after_s ({self.stale_after_s}) must be at least interval_s")
        return self

    @property
    def stale_bound_s(self) -> float:
        """`stale_after_s`, or 3 × `interval_s` when unset."""
        return self.stale_after_s if self.stale_after_s is not None else 3.0 * self.interval_s
