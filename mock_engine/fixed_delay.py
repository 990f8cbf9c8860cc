"""The simplest core: every request is independent; first token after a fixed delay, then one per step.

    t_first = arrival + first_token_delay_s
    t_k     = t_first + k · token_delay_s           (k = 0 … max_tokens − 1)

A disaggregated decode request (`kv_transfer_s` > 0: its KV comes from a prefill replica) skips the
prefill: t_first = arrival + kv_transfer_s + token_delay_s.

No batching, no KV limit: this is the "infinitely wide GPU" used for fast functional tests. The physics
core (continuous batching, KV capacity, prefix cache) implements the same `EngineCore` contract.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from mock_engine.core import EngineRequest, EngineStats, TokenEvent


@dataclass(slots=True)
class _Running:
    request: EngineRequest
    emitted: int
    next_s: float


class FixedDelayCore:
    """`EngineCore` with per-request fixed delays (see module docstring)."""

    def __init__(self, first_token_delay_s: float = 0.0, token_delay_s: float = 0.0) -> None:
        self._first_token_delay_s = first_token_delay_s
        self._token_delay_s = token_delay_s
        self._running: dict[str, _Running] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0

    def submit(self, request: EngineRequest) -> None:
        if request.kv_transfer_s > 0:
            first_s = request.arrival_s + request.kv_transfer_s + self._token_delay_s
        else:
            first_s = request.arrival_s + self._first_token_delay_s
        self._running[request.request_id] = _Running(request, 0, first_s)
        self._push(first_s, request.request_id)
        self._prompt_tokens_total += request.prompt_tokens

    def abort(self, request_id: str) -> None:
        self._running.pop(request_id, None)

    def advance(self, now_s: float) -> list[TokenEvent]:
        events: list[TokenEvent] = []
        while self._heap and self._heap[0][0] <= now_s:
            due_s, _, request_id = heapq.heappop(self._heap)
            state = self._running.get(request_id)
            if state is None or state.next_s != due_s:
                continue
            finished = state.emitted + 1 >= state.request.max_tokens
            events.append(TokenEvent(request_id, state.emitted, due_s, finished))
            state.emitted += 1
            self._generation_tokens_total += 1
            if finished:
                del self._running[request_id]
            else:
                state.next_s = due_s + self._token_delay_s
                self._push(state.next_s, request_id)
        return events

    def next_event_s(self) -> float | None:
        while self._heap:
            due_s, _, request_id = self._heap[0]
            state = self._running.get(request_id)
            if state is not None and state.next_s == due_s:
                return due_s
            heapq.heappop(self._heap)
        return None

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self._running),
            waiting=0,
            kv_usage_ratio=0.0,
            prefix_cache_queries_tokens=0,
            prefix_cache_hits_tokens=0,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            preemptions_total=0,
        )

    def _push(self, due_s: float, request_id: str) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due_s, self._seq, request_id))
