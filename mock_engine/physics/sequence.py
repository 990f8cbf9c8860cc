"""One request's life inside the physics core: waiting → running (prefill, then decode) → done.

Token bookkeeping of a running sequence (P = prompt tokens, e = output tokens emitted so far):

    prefill_target_tokens = max(P, 1) + e     a preempted sequence recomputes its outputs too
    computed_tokens       ∈ [cached prefix, prefill_target_tokens]; prefill is done when equal
    kv_tokens             = tokens with a KV slot; blocks held = ceil(kv_tokens / block_size)

The prefill step samples output token e; each decode step writes the last emitted token's KV
(kv_tokens + 1) and samples the next one.

Disaggregated decode (`request.kv_transfer_s` > 0): at its first admission the whole context's KV is
allocated as usual, computed_tokens = prefill_target_tokens − 1 (the prompt's KV arrives from the
prefill replica; the last token is recomputed here to sample, as vLLM's decode side does), and the
sequence is not scheduled before `transfer_done_s` = admission step start + kv_transfer_s.
A preempted sequence (`kv_received`) recomputes locally like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from mock_engine.core import EngineRequest


class SequenceStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


@dataclass(slots=True, eq=False)
class SequenceState:
    """Mutable per-request state; owned by exactly one `PhysicsCore`."""

    request: EngineRequest
    prompt_block_hashes: tuple[int, ...]
    status: SequenceStatus = SequenceStatus.WAITING
    emitted_tokens: int = 0
    prefill_target_tokens: int = 0
    computed_tokens: int = 0
    kv_tokens: int = 0
    private_blocks: int = 0
    cached_hashes: list[int] = field(default_factory=list)
    transfer_done_s: float = float("-inf")
    kv_received: bool = False
    last_token_s: float | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prefill_done(self) -> bool:
        return self.computed_tokens >= self.prefill_target_tokens

    @property
    def prefill_remaining_tokens(self) -> int:
        return self.prefill_target_tokens - self.computed_tokens

    @property
    def finished(self) -> bool:
        return self.emitted_tokens >= self.request.max_tokens

    def transferring(self, now_s: float) -> bool:
        """True while its KV is still on the link (not schedulable before `transfer_done_s`)."""
        return self.transfer_done_s > now_s

    def context_tokens_to_prefill(self) -> int:
        """max(P, 1) + e: what a (re)admission must have in KV before sampling the next token."""
        return max(self.request.prompt_tokens, 1) + self.emitted_tokens

    def reset_kv(self) -> None:
        """Forget KV state (after release on preemption); progress in emitted tokens is kept."""
        self.prefill_target_tokens = 0
        self.computed_tokens = 0
        self.kv_tokens = 0
        self.private_blocks = 0
        self.cached_hashes = []
