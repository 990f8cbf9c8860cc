"""`PhysicsCore`: a continuous-batching engine over simulated seconds (an `EngineCore`).

The engine runs one *step* (forward pass) at a time; a step is planned when it starts and its tokens
appear when it ends. Planning a step at `start_s`, in vLLM's order:

1. Decode: every running sequence whose prefill is done gets one token. When the KV blocks for those
   tokens are not free, the youngest running sequence (last admitted) is preempted: its KV is freed
   and it goes back to the *front* of the waiting queue, to be recomputed later (prompt + outputs).
2. Prefill: running sequences mid-prefill continue, then waiting requests are admitted FIFO while
   `max_num_seqs`, KV blocks (for the whole uncached context) and the chunked-prefill token budget
   allow. Admission stops at the first request that does not fit (no overtaking), and is skipped in a
   step that preempted. Cached prefix blocks count as computed (they skip prefill). The one exception,
   vLLM's `max_loras` rule: a request for a LoRA adapter that would make more than `max_loras` distinct
   adapters run is passed over (it keeps its place at the head of the queue) and the requests behind
   it may be admitted — base-model requests, requests for an adapter already running.
3. Duration: `profile.step_s(Σ decode ctx, prefill tokens)` (formula in `profile.py`), so a long
   prefill delays the decode tokens of every sequence on the replica.

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

import sys
from collections import deque
from dataclasses import dataclass

from mock_engine.core import (
    DEFAULT_MAX_LORAS,
    EngineRequest,
    EngineStats,
    TokenEvent,
    distinct_adapters,
    lora_blocked,
)
from mock_engine.physics.kv_cache import KvBlockPool
from mock_engine.physics.profile import EngineProfile
from mock_engine.physics.sequence import SequenceState, SequenceStatus
from mock_engine.physics.tokens import prefix_block_hashes


class RequestTooLargeError(ValueError):
    """prompt + max_tokens exceeds the replica's whole KV capacity: it could never be served."""


@dataclass(slots=True)
class _Step:
    start_s: float
    end_s: float
    decode: list[SequenceState]
    prefill: list[tuple[SequenceState, int]]


class PhysicsCore:
    """`EngineCore` with continuous batching, KV capacity, preemption and a prefix cache."""

    def __init__(self, profile: EngineProfile, max_loras: int = DEFAULT_MAX_LORAS) -> None:
        self._profile = profile
        self.max_loras = max_loras
        self._block_size_tokens = profile.scheduler.block_size_tokens
        self._kv = KvBlockPool(profile.kv_capacity_blocks)
        self._waiting: deque[SequenceState] = deque()
        self._running: dict[str, SequenceState] = {}
        self._live: dict[str, SequenceState] = {}
        self._step: _Step | None = None
        self._clock_s = float("-inf")
        self._preemptions_total = 0
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._inter_token_sum_s = 0.0
        self._inter_token_count = 0
        self._prefix_queries_tokens = 0
        self._prefix_hits_tokens = 0

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
            self._release(sequence)
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
            prefix_cache_queries_tokens=self._prefix_queries_tokens,
            prefix_cache_hits_tokens=self._prefix_hits_tokens,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            preemptions_total=self._preemptions_total,
            inter_token_latency_sum_s=self._inter_token_sum_s,
            inter_token_latency_count=self._inter_token_count,
            running_adapters=distinct_adapters(s.request.adapter for s in self._running.values()),
            waiting_adapters=distinct_adapters(s.request.adapter for s in self._waiting),
        )

    # -- planning ---------------------------------------------------------------------------------

    def _ensure_step(self, limit_s: float) -> None:
        """Start the next step if none is in flight, there is work, and it would start by `limit_s`."""
        if self._step is not None or not (self._running or self._waiting):
            return
        start_s = self._clock_s
        if not self._running:
            start_s = max(start_s, self._waiting[0].request.arrival_s)
        if start_s <= limit_s:
            self._step = self._plan(start_s)

    def _plan(self, start_s: float) -> _Step | None:
        preemptions_before = self._preemptions_total
        decode = self._schedule_decode()
        may_admit = self._preemptions_total == preemptions_before
        prefill = self._schedule_prefill(start_s, len(decode), may_admit)
        if not decode and not prefill:
            return self._idle_until_transfer(start_s)
        context_tokens = sum(sequence.kv_tokens for sequence in decode)
        prefill_tokens = sum(tokens for _, tokens in prefill)
        end_s = start_s + self._profile.step_s(context_tokens, prefill_tokens)
        return _Step(start_s, end_s, decode, prefill)

    def _idle_until_transfer(self, start_s: float) -> _Step | None:
        """A step with no work that ends when the first KV transfer lands (or the next request arrives),
        so a replica whose only sequences are waiting for their KV still wakes; None when there is none."""
        pending = [s.transfer_done_s for s in self._running.values() if s.transferring(start_s)]
        if not pending:
            return None
        end_s = min(pending)
        if self._waiting and self._waiting[0].request.arrival_s > start_s:
            end_s = min(end_s, self._waiting[0].request.arrival_s)
        return _Step(start_s, end_s, [], [])

    def _schedule_decode(self) -> list[SequenceState]:
        """One KV slot per decoding sequence, preempting the youngest until the new blocks fit."""
        block = self._block_size_tokens
        decoding = [s for s in self._running.values() if s.prefill_done]
        needed_blocks = sum(1 for s in decoding if s.kv_tokens % block == 0)
        preempted = False
        while needed_blocks > self._kv.free_blocks:
            victim = next(reversed(self._running.values()))
            if victim.prefill_done and victim.kv_tokens % block == 0:
                needed_blocks -= 1
            self._preempt(victim)
            preempted = True
        if preempted:
            decoding = [s for s in decoding if s.status is SequenceStatus.RUNNING]
        for sequence in decoding:
            if sequence.kv_tokens % block == 0:
                self._kv.allocate(1)
                sequence.private_blocks += 1
            sequence.kv_tokens += 1
        return decoding

    def _preempt(self, victim: SequenceState) -> None:
        """Free the victim's KV and put it at the front of the waiting queue (recompute later)."""
        del self._running[victim.request_id]
        self._release(victim)
        victim.status = SequenceStatus.WAITING
        self._waiting.appendleft(victim)
        self._preemptions_total += 1

    def _schedule_prefill(
        self, start_s: float, decode_tokens: int, may_admit: bool
    ) -> list[tuple[SequenceState, int]]:
        """Continue running prefills, then admit waiting requests FIFO, within the token budget."""
        chunk_tokens = self._profile.prefill.chunk_tokens_per_step
        budget_tokens = sys.maxsize if chunk_tokens is None else chunk_tokens - decode_tokens
        scheduled: list[tuple[SequenceState, int]] = []
        for sequence in self._running.values():
            if budget_tokens <= 0:
                break
            if not sequence.prefill_done and not sequence.transferring(start_s):
                tokens = min(sequence.prefill_remaining_tokens, budget_tokens)
                scheduled.append((sequence, tokens))
                budget_tokens -= tokens
        max_num_seqs = self._profile.scheduler.max_num_seqs
        adapters = set(distinct_adapters(s.request.adapter for s in self._running.values()))
        passed_over: list[SequenceState] = []
        while may_admit and self._waiting and budget_tokens > 0 and len(self._running) < max_num_seqs:
            head = self._waiting[0]
            if head.request.arrival_s > start_s:
                break
            if lora_blocked(head.request.adapter, adapters, self.max_loras):
                passed_over.append(self._waiting.popleft())
                continue
            if not self._admit(head, start_s):
                break
            self._waiting.popleft()
            if head.request.adapter is not None:
                adapters.add(head.request.adapter)
            if head.transferring(start_s):
                continue
            tokens = min(head.prefill_remaining_tokens, budget_tokens)
            scheduled.append((head, tokens))
            budget_tokens -= tokens
        self._waiting.extendleft(reversed(passed_over))
        return scheduled

    def _admit(self, sequence: SequenceState, start_s: float) -> bool:
        """Allocate KV for the whole context, reusing cached prefix blocks; False if it does not fit.

        At most (target - 1) // block blocks may hit, so at least one token is computed (the step
        that samples the next token needs one). A disaggregated decode's first admission starts its KV
        transfer instead of a prefill (see `sequence.py`).
        """
        block = self._block_size_tokens
        target_tokens = sequence.context_tokens_to_prefill()
        candidates = sequence.prompt_block_hashes[: (target_tokens - 1) // block]
        hit_blocks, evictable_hits = self._kv.match_prefix(candidates)
        new_blocks = -(-target_tokens // block) - hit_blocks
        if new_blocks + evictable_hits > self._kv.free_blocks:
            return False
        hit_hashes = candidates[:hit_blocks]
        self._kv.pin(hit_hashes)
        self._kv.allocate(new_blocks)
        sequence.cached_hashes = list(hit_hashes)
        sequence.private_blocks = new_blocks
        sequence.prefill_target_tokens = sequence.kv_tokens = target_tokens
        sequence.computed_tokens = hit_blocks * block
        if sequence.request.kv_transfer_s > 0 and not sequence.kv_received:
            sequence.kv_received = True
            sequence.computed_tokens = target_tokens - 1
            sequence.transfer_done_s = start_s + sequence.request.kv_transfer_s
        sequence.status = SequenceStatus.RUNNING
        self._running[sequence.request_id] = sequence
        self._prefix_queries_tokens += target_tokens
        self._prefix_hits_tokens += hit_blocks * block
        return True

    # -- completion -------------------------------------------------------------------------------

    def _finish(self, step: _Step, events: list[TokenEvent]) -> None:
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
            self._release(sequence)
            sequence.status = SequenceStatus.DONE

    def _register_prompt_blocks(self, sequence: SequenceState) -> None:
        """Cache the prompt's full blocks just computed (those past the prefix it hit)."""
        new_hashes = sequence.prompt_block_hashes[len(sequence.cached_hashes) :]
        self._kv.register(new_hashes)
        sequence.cached_hashes.extend(new_hashes)
        sequence.private_blocks -= len(new_hashes)

    def _release(self, sequence: SequenceState) -> None:
        self._kv.release(sequence.private_blocks, sequence.cached_hashes)
        sequence.reset_kv()
