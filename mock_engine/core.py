"""The contract between the mock engine's server and its pure serving model.

A core is a deterministic state machine over *simulated* seconds. The server owns the clock: it calls
`advance(now_s)` whenever it wakes and sleeps until `next_event_s()` (scaled by the speed factor) or a
new submission. Nothing in a core sleeps, reads a clock, or does I/O, so tests drive it with plain floats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """A generation request as the core sees it (text already tokenised by the documented estimate)."""

    request_id: str
    prompt_text: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    kv_transfer_s: float = 0.0
    """> 0 on a disaggregated decode replica: the prompt's KV arrives from a prefill replica over this many
    seconds after admission (KV blocks held meanwhile) instead of being computed here."""


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One output token of one request, emitted at simulated time `time_s`. `index` is 0-based."""

    request_id: str
    index: int
    time_s: float
    finished: bool


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters and gauges the server exports on /metrics (named per flavour there)."""

    running: int
    waiting: int
    kv_usage_ratio: float
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int


class EngineCore(Protocol):
    """A serving model: submit/abort requests, advance simulated time, report tokens and stats."""

    def submit(self, request: EngineRequest) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def advance(self, now_s: float) -> list[TokenEvent]:
        """Simulate up to `now_s`; return every token emitted in (previous now, now_s], in time order."""
        ...

    def next_event_s(self) -> float | None:
        """Simulated time of the next token, or None when nothing is running or waiting."""
        ...

    def stats(self) -> EngineStats: ...
