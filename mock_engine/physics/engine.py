"""`PhysicsCore`: a continuous-batching engine over simulated seconds (an `EngineCore`).

The engine runs one *step* (forward pass) at a time; a step is planned when it starts, in vLLM's order
(decode, with preemption; prefill and admission; duration: `scheduler.py`), and its tokens appear when
it ends.

At `end_s` each decoding sequence emits a token; each sequence whose prefill completed registers its
prompt blocks in the prefix cache and emits its next token (the first one, for a fresh request).
A finished or aborted sequence frees its KV at once.

Time: the core only knows the times it is given. `advance(now_s)` completes every step ending at or
before `now_s`, starting the next one back-to-back (a request joins at the first step that starts at
or after its `arrival_s`). `next_event_s()` is the end of the step in flight — starting it, if the
engine is idle, at max(last time seen, first waiting arrival). A step normally emits tokens; a step
that only advances a chunked prefill emits none, and the caller simply asks again. Requests are
expected in non-decreasing `arrival_s` order (one submitted out of order waits behind the queue head).
Each step costs O(running + admitted) Python work; nothing scales with history.

Prefix-cache keys are salted with the request's adapter (`tokens.py`): each model has its own cache.

Stats: `kv_usage_ratio` = used blocks / total (evictable cached blocks count as free, as in vLLM);
`prefix_cache_queries_tokens` grows by the context of each admission (prompt, plus the outputs for a
recompute) and `prefix_cache_hits_tokens` by the cached tokens it skipped; `prompt_tokens_total` counts
a prompt when its first token is produced; `preemptions_total` counts each preemption.
"""

from __future__ import annotations

from mock_engine.core import (
    DEFAULT_MAX_LORAS,
    EngineRequest,
    EngineStats,
    TokenEvent,
    distinct_adapters,
)
from mock_engine.physics.profile import EngineProfile
from mock_engine.physics.scheduler import Step, StepScheduler
from mock_engine.physics.sequence import SequenceState, SequenceStatus
from mock_engine.physics.tokens import prefix_block_hashes


class RequestTooLargeError(ValueError):
    """prompt + max_tokens exceeds the replica's whole KV capacity: it could never be served."""


class PhysicsCore:
    """`EngineCore` with continuous batching, KV capacity, preemption and a prefix cache."""

    def __init__(self, profile: EngineProfile, max_loras: int = DEFAULT_MAX_LORAS) -> None:
        self._profile = profile
        self.max_loras = max_loras
        self._block_size_tokens = profile.scheduler.block_size_tokens
        self._scheduler = StepScheduler(profile)
        self._kv = self._scheduler.kv  # the scheduler's own pool, queue and running set (never replaced)
        self._waiting = self._scheduler.waiting
        self._running = self._scheduler.running
        self._live: dict[str, SequenceState] = {}
        self._step: Step | None = None
        self._clock_s = float("-inf")
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._inter_token_sum_s = 0.0
        self._inter_token_count = 0

    @property
    def profile(self) -> EngineProfile:
        return self._profile

    @property
    def kv_capacity_tokens(self) -> int:
        """Usable KV tokens: kv_capacity_blocks · block_size_tokens (the largest prompt + output)."""
        return self._kv.total_blocks * self._block_size_tokens

    @property
    def cached_prefix_blocks(self) -> int:
        """Prefix-cache entries (pinned by running sequences or evictable)."""
        return self._kv.cached_blocks

    def submit(self, request: EngineRequest) -> None:
        """Queue a request (FIFO). Raises ValueError on a duplicate id or max_tokens < 1, and
        `RequestTooLargeError` when max(prompt, 1) + max_tokens exceeds `kv_capacity_tokens`."""
        if request.request_id in self._live:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {request.max_tokens}")
        if max(request.prompt_tokens, 1) + request.max_tokens > self.kv_capacity_tokens:
            raise RequestTooLargeError(
                f"prompt {request.prompt_tokens} + max_tokens {request.max_tokens} tokens exceed the "
                f"KV capacity of {self.kv_capacity_tokens} tokens"
            )
        max_blocks = request.prompt_tokens // self._block_size_tokens
        hashes = prefix_block_hashes(
            request.prompt_text, self._block_size_tokens, max_blocks, adapter=request.adapter
        )
        sequence = SequenceState(request, tuple(hashes))
        self._waiting.append(sequence)
        self._live[request.request_id] = sequence

    def abort(self, request_id: str) -> None:
        """Drop a request wherever it is, freeing its KV now; unknown or finished ids are ignored."""
        sequence = self._live.pop(request_id, None)
        if sequence is None:
            return
        if sequence.status is SequenceStatus.RUNNING:
            del self._running[request_id]
            self._scheduler.release(sequence)
        else:
            self._waiting.remove(sequence)
        sequence.status = SequenceStatus.DONE

    def advance(self, now_s: float) -> list[TokenEvent]:
        """Complete every step ending at or before `now_s`; return their tokens in time order."""
        events: list[TokenEvent] = []
        while True:
            self._ensure_step(now_s)
            step = self._step
            if step is None or step.end_s > now_s:
                break
            self._step = None
            self._clock_s = step.end_s
            self._finish(step, events)
        self._clock_s = max(self._clock_s, now_s)
        return events

    def next_event_s(self) -> float | None:
        """End of the step in flight (see the module docstring), or None when idle and empty."""
        self._ensure_step(float("inf"))
        return None if self._step is None else self._step.end_s

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_usage_ratio=self._kv.usage_ratio(),
            prefix_cache_queries_tokens=self._scheduler.prefix_queries_tokens,
            prefix_cache_hits_tokens=self._scheduler.prefix_hits_tokens,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            preemptions_total=self._scheduler.preemptions_total,
            inter_token_latency_sum_s=self._inter_token_sum_s,
            inter_token_latency_count=self._inter_token_count,
            running_adapters=distinct_adapters(s.request.adapter for s in self._running.values()),
            waiting_adapters=distinct_adapters(s.request.adapter for s in self._waiting),
        )

    # -- stepping ---------------------------------------------------------------------------------

    def _ensure_step(self, limit_s: float) -> None:
        """Start the next step if none is in flight, there is work, and it would start by `limit_s`."""
        if self._step is not None or not (self._running or self._waiting):
            return
        start_s = self._clock_s
        if not self._running:
            start_s = max(start_s, self._waiting[0].request.arrival_s)
        if start_s <= limit_s:
            self._step = self._scheduler.plan(start_s, self.max_loras)

    # -- completion -------------------------------------------------------------------------------

    def _finish(self, step: Step, events: list[TokenEvent]) -> None:
        for sequence in step.decode:
            if sequence.status is SequenceStatus.RUNNING:
                self._emit(sequence, step.end_s, events)
        for sequence, tokens in step.prefill:
            if sequence.status is not SequenceStatus.RUNNING:
                continue
            sequence.computed_tokens += tokens
            if sequence.prefill_done:
                self._register_prompt_blocks(sequence)
                self._emit(sequence, step.end_s, events)

    def _emit(self, sequence: SequenceState, time_s: float, events: list[TokenEvent]) -> None:
        index = sequence.emitted_tokens
        sequence.emitted_tokens += 1
        self._generation_tokens_total += 1
        if index == 0:
            self._prompt_tokens_total += sequence.request.prompt_tokens
        elif sequence.last_token_s is not None:
            self._inter_token_sum_s += time_s - sequence.last_token_s
            self._inter_token_count += 1
        sequence.last_token_s = time_s
        finished = sequence.finished
        events.append(TokenEvent(sequence.request_id, index, time_s, finished))
        if finished:
            del self._running[sequence.request_id]
            del self._live[sequence.request_id]
            self._scheduler.release(sequence)
            sequence.status = SequenceStatus.DONE

    def _register_prompt_blocks(self, sequence: SequenceState) -> None:
        """Cache the prompt's full blocks just computed (those past the prefix it hit)."""
        new_hashes = sequence.prompt_block_hashes[len(sequence.cached_hashes) :]
        self._kv.register(new_hashes)
        sequence.cached_hashes.extend(new_hashes)
        sequence.private_blocks -= len(new_hashes)
