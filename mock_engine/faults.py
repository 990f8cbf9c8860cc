"""Fault injection for the mock engine, deterministic under a seed and changeable at run time.

`error_rate` of requests are answered `error_status` at once (with `Retry-After: retry_after_s` for
429/503 when set) instead of being served. Settable at start (CLI flags) and at run time with
`POST /mock/faults` and a JSON object of the fields to change.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class FaultSettings:
    error_rate: float = 0.0
    error_status: int = 500
    retry_after_s: float | None = None

    def updated(self, changes: dict[str, Any]) -> FaultSettings:
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown fault fields: {', '.join(sorted(unknown))}")
        new = replace(self, **changes)
        if not 0.0 <= new.error_rate <= 1.0:
            raise ValueError("error_rate must be within [0, 1]")
        if not 400 <= new.error_status <= 599:
            raise ValueError("error_status must be an HTTP error status")
        return new

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class FaultInjector:
    def __init__(self, settings: FaultSettings, rng: random.Random) -> None:
        self.settings = settings
        self._rng = rng

    def should_fail(self) -> bool:
        rate = self.settings.error_rate
        return rate > 0 and self._rng.random() < rate
