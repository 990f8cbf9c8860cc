"""Planning one step of the `PhysicsCore` (a forward pass, planned when it starts; its tokens appear when
it ends, `engine.py`) at `start_s`, in vLLM's order:

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

The scheduler owns the waiting queue, the running sequences and the KV block pool; it counts
preemptions and the prefix-cache queries and hits of each admission (the engine's stats read them).
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass

from mock_engine.core import distinct_adapters, lora_blocked
from mock_engine.physics.kv_cache import KvBlockPool
from mock_engine.physics.profile import EngineProfile
from mock_engine.physics.sequence import SequenceState, SequenceStatus


@dataclass(slots=True)
class Step:
    """One planned forward pass: its times, the decoding sequences, and each prefill with its tokens."""

    start_s: float
    end_s: float
    decode: list[SequenceState]
    prefill: list[tuple[SequenceState, int]]


class StepScheduler:
    """Plans the steps of one engine (see the module docstring)."""

    def __init__(self, profile: EngineProfile) -> None:
        self.profile = profile
        self.block_size_tokens = profile.scheduler.block_size_tokens
        self.kv = KvBlockPool(profile.kv_capacity_blocks)
        self.waiting: deque[SequenceState] = deque()
        self.running: dict[str, SequenceState] = {}
        self.preemptions_total = 0
        self.prefix_queries_tokens = 0
        self.prefix_hits_tokens = 0

    def plan(self, start_s: float, max_loras: int) -> Step | None:
        """The step starting at `start_s` (see the module docstring); None when there is nothing to do."""
        preemptions_before = self.preemptions_total
        decode = self._schedule_decode()
        may_admit = self.preemptions_total == preemptions_before
        prefill = self._schedule_prefill(start_s, len(decode), may_admit, max_loras)
        if not decode and not prefill:
            return self._idle_until_transfer(start_s)
        context_tokens = sum(sequence.kv_tokens for sequence in decode)
        prefill_tokens = sum(tokens for _, tokens in prefill)
        end_s = start_s + self.profile.step_s(context_tokens, prefill_tokens)
        return Step(start_s, end_s, decode, prefill)

    def _idle_until_transfer(self, start_s: float) -> Step | None:
        """A step with no work that ends when the first KV transfer lands (or the next request arrives),
        so a replica whose only sequences are waiting for their KV still wakes; None when there is none."""
        pending = [s.transfer_done_s for s in self.running.values() if s.transferring(start_s)]
        if not pending:
            return None
        end_s = min(pending)
        if self.waiting and self.waiting[0].request.arrival_s > start_s:
            end_s = min(end_s, self.waiting[0].request.arrival_s)
        return Step(start_s, end_s, [], [])

    def _schedule_decode(self) -> list[SequenceState]:
        """One KV slot per decoding sequence, preempting the youngest until the new blocks fit."""
        block = self.block_size_tokens
        decoding = [s for s in self.running.values() if s.prefill_done]
        needed_blocks = sum(1 for s in decoding if s.kv_tokens % block == 0)
        preempted = False
        while needed_blocks > self.kv.free_blocks:
            victim = next(reversed(self.running.values()))
            if victim.prefill_done and victim.kv_tokens % block == 0:
                needed_blocks -= 1
            self._preempt(victim)
            preempted = True
        if preempted:
            decoding = [s for s in decoding if s.status is SequenceStatus.RUNNING]
        for sequence in decoding:
            if sequence.kv_tokens % block == 0:
                self.kv.allocate(1)
                sequence.private_blocks += 1
            sequence.kv_tokens += 1
        return decoding

    def _preempt(self, victim: SequenceState) -> None:
        """Free the victim's KV and put it at the front of the waiting queue (recompute later)."""
        del self.running[victim.request_id]
        self.release(victim)
        victim.status = SequenceStatus.WAITING
        self.waiting.appendleft(victim)
        self.preemptions_total += 1

    def _schedule_prefill(
        self, start_s: float, decode_tokens: int, may_admit: bool, max_loras: int
    ) -> list[tuple[SequenceState, int]]:
        """Continue running prefills, then admit waiting requests FIFO, within the token budget."""
        chunk_tokens = self.profile.prefill.chunk_tokens_per_step
        budget_tokens = sys.maxsize if chunk_tokens is None else chunk_tokens - decode_tokens
        scheduled: list[tuple[SequenceState, int]] = []
        for sequence in self.running.values():
            if budget_tokens <= 0:
                break
            if not sequence.prefill_done and not sequence.transferring(start_s):
                tokens = min(sequence.prefill_remaining_tokens, budget_tokens)
                scheduled.append((sequence, tokens))
                budget_tokens -= tokens
        max_num_seqs = self.profile.scheduler.max_num_seqs
        adapters = set(distinct_adapters(s.request.adapter for s in self.running.values()))
        passed_over: list[SequenceState] = []
        while may_admit and self.waiting and budget_tokens > 0 and len(self.running) < max_num_seqs:
            head = self.waiting[0]
            if head.request.arrival_s > start_s:
                break
            if lora_blocked(head.request.adapter, adapters, max_loras):
                passed_over.append(self.waiting.popleft())
                continue
            if not self._admit(head, start_s):
                break
            self.waiting.popleft()
            if head.request.adapter is not None:
                adapters.add(head.request.adapter)
            if head.transferring(start_s):
                continue
            tokens = min(head.prefill_remaining_tokens, budget_tokens)
            scheduled.append((head, tokens))
            budget_tokens -= tokens
        self.waiting.extendleft(reversed(passed_over))
        return scheduled

    def _admit(self, sequence: SequenceState, start_s: float) -> bool:
        """Allocate KV for the whole context, reusing cached prefix blocks; False if it does not fit.

        At most (target - 1) // block blocks may hit, so at least one token is computed (the step
        that samples the next token needs one). A disaggregated decode's first admission starts its KV
        transfer instead of a prefill (see `sequence.py`).
        """
        block = self.block_size_tokens
        target_tokens = sequence.context_tokens_to_prefill()
        candidates = sequence.prompt_block_hashes[: (target_tokens - 1) // block]
        hit_blocks, evictable_hits = self.kv.match_prefix(candidates)
        new_blocks = -(-target_tokens // block) - hit_blocks
        if new_blocks + evictable_hits > self.kv.free_blocks:
            return False
        hit_hashes = candidates[:hit_blocks]
        self.kv.pin(hit_hashes)
        self.kv.allocate(new_blocks)
        sequence.cached_hashes = list(hit_hashes)
        sequence.private_blocks = new_blocks
        sequence.prefill_target_tokens = sequence.kv_tokens = target_tokens
        sequence.computed_tokens = hit_blocks * block
        if sequence.request.kv_transfer_s > 0 and not sequence.kv_received:
            sequence.kv_received = True
            sequence.computed_tokens = target_tokens - 1
            sequence.transfer_done_s = start_s + sequence.request.kv_transfer_s
        sequence.status = SequenceStatus.RUNNING
        self.running[sequence.request_id] = sequence
        self.prefix_queries_tokens += target_tokens
        self.prefix_hits_tokens += hit_blocks * block
        return True

    def release(self, sequence: SequenceState) -> None:
        """Free the sequence's KV (its private blocks, and its pins on cached prefix blocks)."""
        self.kv.release(sequence.private_blocks, sequence.cached_hashes)
        sequence.reset_kv()
