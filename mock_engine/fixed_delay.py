"""The simplest core: every request is independent; first token after a fixed delay, then one per step.

    t_first = start + first_token_delay_s
    t_k     = t_first + k · token_delay_s           (k = 0 … max_tokens − 1)

`start` is the request's arrival, unless it had to wait for an adapter slot (below). A disaggregated
decode request (`kv_transfer_s` > 0: its KV comes from a prefill replica) skips the prefill:
t_first = start + kv_transfer_s + token_delay_s.

No batching, no KV limit: this is the "infinitely wide GPU" used for fast functional tests. The physics
core (continuous batching, KV capacity, prefix cache) implements the same `EngineCore` contract.

LoRA adapters (`core.py`): a request for an adapter that would make more than `max_loras` distinct
adapters run at once waits (counted in `waiting`); when the last running request of an adapter finishes
or is aborted, the waiting requests are started in arrival order, each one that the rule now lets in,
at that instant (an abort's instant is the latest time the core has seen).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from dataclasses import dataclass

from mock_engine.core import (
    DEFAULT_MAX_LORAS,
    EngineRequest,
    EngineStats,
    TokenEvent,
    distinct_adapters,
    lora_blocked,
)


@dataclass(slots=True)
class _Running:
    request: EngineRequest
    emitted: int
    next_s: float


class FixedDelayCore:
    """`EngineCore` with per-request fixed delays (see module docstring)."""

    def __init__(
        self, first_token_delay_s: float = 0.0, token_delay_s: float = 0.0, max_loras: int = DEFAULT_MAX_LORAS
    ) -> None:
        self._first_token_delay_s = first_token_delay_s
        self._token_delay_s = token_delay_s
        self.max_loras = max_loras
        self._running: dict[str, _Running] = {}
        self._waiting: deque[EngineRequest] = deque()
        self._adapters: Counter[str] = Counter()
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0
        self._now_s = float("-inf")
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._inter_token_sum_s = 0.0
        self._inter_token_count = 0

    def submit(self, request: EngineRequest) -> None:
        self._now_s = max(self._now_s, request.arrival_s)
        self._prompt_tokens_total += request.prompt_tokens
        if lora_blocked(request.adapter, self._adapters, self.max_loras):
            self._waiting.append(request)
        else:
            self._start(request, request.arrival_s)

    def abort(self, request_id: str) -> None:
        state = self._running.pop(request_id, None)
        if state is not None:
            self._release(state.request, self._now_s)
            return
        for request in self._waiting:
            if request.request_id == request_id:
                self._waiting.remove(request)
                return

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
            if state.emitted > 1:  # its first token has no gap before it
                self._inter_token_sum_s += self._token_delay_s
                self._inter_token_count += 1
            if finished:
                del self._running[request_id]
                self._release(state.request, due_s)
            else:
                state.next_s = due_s + self._token_delay_s
                self._push(state.next_s, request_id)
        self._now_s = max(self._now_s, now_s)
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
            waiting=len(self._waiting),
            kv_usage_ratio=0.0,
            prefix_cache_queries_tokens=0,
            prefix_cache_hits_tokens=0,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            preemptions_total=0,
            inter_token_latency_sum_s=self._inter_token_sum_s,
            inter_token_latency_count=self._inter_token_count,
            running_adapters=distinct_adapters(s.request.adapter for s in self._running.values()),
            waiting_adapters=distinct_adapters(r.adapter for r in self._waiting),
        )

    def _start(self, request: EngineRequest, start_s: float) -> None:
        if request.kv_transfer_s > 0:
            first_s = start_s + request.kv_transfer_s + self._token_delay_s
        else:
            first_s = start_s + self._first_token_delay_s
        self._running[request.request_id] = _Running(request, 0, first_s)
        if request.adapter is not None:
            self._adapters[request.adapter] += 1
        self._push(first_s, request.request_id)

    def _release(self, request: EngineRequest, at_s: float) -> None:
        """A running request is gone: when it was its adapter's last, start the waiting ones now allowed."""
        adapter = request.adapter
        if adapter is None:
            return
        self._adapters[adapter] -= 1
        if self._adapters[adapter] > 0:
            return
        del self._adapters[adapter]
        still_waiting: deque[EngineRequest] = deque()
        while self._waiting:
            waiting = self._waiting.popleft()
            if lora_blocked(waiting.adapter, self._adapters, self.max_loras):
                still_waiting.append(waiting)
            else:
                self._start(waiting, max(at_s, waiting.arrival_s))
        self._waiting = still_waiting

    def _push(self, due_s: float, request_id: str) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due_s, self._seq, request_id))
