"""The prefill replica's table of KV transfers, and the claim a decode replica makes against it.

Prefill and decode mocks are separate processes, so a decode cannot see the prefill's memory: it claims
the transfer over HTTP (`POST /mock/kv/claim` on the prefill replica), which is the control-plane half of
NIXL's pull (the decode reads the blocks, then notifies the prefill to free them) and of SGLang's
bootstrap server (the decode learns when the room's KV is ready). The bytes themselves are simulated:
the decode waits the transfer time in its engine core.

An entry is keyed by the vLLM `remote_request_id` or by the SGLang room (as a decimal string):

- `pending` from the moment the prefill leg starts, `done` when its prefill finished, `failed` when it was
  aborted (client gone, crash). A claim of a `done` entry removes it (one decode per transfer).
- Entries not claimed within `hold_s` of their creation are dropped (vLLM frees the blocks after
  `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`, 480 s by default), so the table never grows without bound.

Claim answers (`ClaimResult.status`): `done` (with the prefill's prompt tokens), `pending` (still
computing after the wait), `unknown` (no such entry: never registered, expired or already claimed),
`failed`, or `mismatch` (the claim names another engine, other blocks or another prompt length).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Status = Literal["pending", "done", "failed", "unknown", "mismatch"]
DEFAULT_HOLD_S = 480.0


@dataclass(slots=True)
class _Entry:
    prompt_tokens: int
    block_ids: tuple[int, ...]
    created_s: float
    status: Status = "pending"
    ready: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    status: Status
    prompt_tokens: int = 0
    message: str = ""


class TransferTable:
    """In-process transfers of one prefill replica (one event loop). `clock` gives wall seconds."""

    def __init__(self, hold_s: float = DEFAULT_HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: dict[str, _Entry] = {}
        self._hold_s = hold_s
        self._clock = clock
        self.completed_total = 0
        self.claimed_total = 0

    def __len__(self) -> int:
        return len(self._entries)

    def register(self, key: str, prompt_tokens: int, block_ids: tuple[int, ...] = ()) -> None:
        """A prefill leg started (a duplicate key replaces the old entry, as a reused room would)."""
        self._expire()
        self._entries[key] = _Entry(prompt_tokens, block_ids, self._clock())

    def finish(self, key: str, ok: bool) -> None:
        """The prefill leg ended: `done` when its prefill completed, else `failed`; wakes the claims."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.status = "done" if ok else "failed"
        if ok:
            self.completed_total += 1
        entry.ready.set()

    async def claim(
        self,
        key: str,
        wait_s: float,
        prompt_tokens: int,
        block_ids: tuple[int, ...] | None = None,
    ) -> ClaimResult:
        """Wait up to `wait_s` for the entry to leave `pending`; a `done` one is removed and returned.

        `block_ids` None: not checked (SGLang names no blocks). Prompt tokens are always checked."""
        self._expire()
        entry = self._entries.get(key)
        if entry is None:
            return ClaimResult("unknown", message=f"no KV transfer {key!r} held here")
        if entry.status == "pending" and wait_s > 0:
            try:
                async with asyncio.timeout(wait_s):
                    await entry.ready.wait()
            except TimeoutError:
                pass
        if self._entries.get(key) is not entry:
            return ClaimResult("unknown", message=f"KV transfer {key!r} was claimed or expired meanwhile")
        if entry.status != "done":
            return ClaimResult(entry.status, message=f"KV transfer {key!r} is {entry.status}")
        if entry.prompt_tokens != prompt_tokens:
            return ClaimResult(
                "mismatch",
                message=f"KV transfer {key!r} holds {entry.prompt_tokens} prompt tokens, the decode leg "
                f"has {prompt_tokens}: not the same prompt",
            )
        if block_ids is not None and block_ids != entry.block_ids:
            return ClaimResult("mismatch", message=f"KV transfer {key!r} holds other blocks")
        del self._entries[key]
        self.claimed_total += 1
        return ClaimResult("done", entry.prompt_tokens)

    def _expire(self) -> None:
        limit_s = self._clock() - self._hold_s
        for key in [k for k, e in self._entries.items() if e.created_s < limit_s]:
            entry = self._entries.pop(key)
            entry.ready.set()
