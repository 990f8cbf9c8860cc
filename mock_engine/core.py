"""The contract between the mock engine's server and its pure serving model.

A core is a deterministic state machine over *simulated* seconds. The server owns the clock: it calls
`advance(now_s)` whenever it wakes and sleeps until `next_event_s()` (scaled by the speed factor) or a
new submission. Nothing in a core sleeps, reads a clock, or does I/O, so tests drive it with plain floats.

LoRA adapters (`adapter` of a request; None is the base model), as vLLM's scheduler treats them: at most
`max_loras` distinct adapters in the running batch; a request for another adapter waits (counted in
`waiting`) while the batch holds `max_loras` others, and requests behind it may start meanwhile (base
model requests, requests for an adapter already running). A core with a prefix cache salts its block keys
with the adapter, so a prompt cached under one model is a miss under another.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
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
    adapter: str | None = None
    """The LoRA adapter it runs with (its name), None for the base model (module docstring)."""


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
    inter_token_latency_sum_s: float = 0.0
    """Σ of the gaps between a request's consecutive output tokens (simulated seconds; a preemption's
    recompute counts in its gap, as in vLLM's `inter_token_latency_seconds`)."""
    inter_token_latency_count: int = 0
    """How many gaps the sum holds (every output token but each request's first)."""
    running_adapters: tuple[str, ...] = ()
    """Distinct adapters of the running requests, in the order they started (vLLM's
    `running_lora_adapters`); the base model is not listed."""
    waiting_adapters: tuple[str, ...] = ()
    """Distinct adapters of the waiting requests, in queue order (`waiting_lora_adapters`)."""


DEFAULT_MAX_LORAS = 1
"""vLLM's `--max-loras` default: one adapter in the batch at a time."""


def distinct_adapters(adapters: Iterable[str | None]) -> tuple[str, ...]:
    """The distinct non-None adapters, in first-seen order."""
    return tuple(dict.fromkeys(a for a in adapters if a is not None))


def lora_blocked(adapter: str | None, running_adapters: Collection[str], max_loras: int) -> bool:
    """vLLM's rule: a request for `adapter` may not join a batch already holding `max_loras` other adapters
    (the base model, None, is never blocked)."""
    return adapter is not None and adapter not in running_adapters and len(running_adapters) >= max_loras


class EngineCore(Protocol):
    """A serving model: submit/abort requests, advance simulated time, report tokens and stats.
    `max_loras` (default `DEFAULT_MAX_LORAS`) bounds the adapters of the running batch (module docstring);
    the server sets it from its configuration before the first request."""

    max_loras: int

    def submit(self, request: EngineRequest) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def advance(self, now_s: float) -> list[TokenEvent]:
        """Simulate up to `now_s`; return every token emitted in (previous now, now_s], in time order."""
        ...

    def next_event_s(self) -> float | None:
        """Simulated time of the next token, or None when nothing is running or waiting."""
        ...

    def stats(self) -> EngineStats: ...
