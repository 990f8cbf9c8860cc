"""The measured outcome of one benchmark request (what the client records, what summaries read)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sample:
    """One request. Times are seconds; `scheduled_s` and `sent_s` are offsets from the run's start.

    `status` is the HTTP status (0 for a transport failure). `ok` means a 200 answer that ended
    normally (`[DONE]` for streams, no terminal error event). `ttft_s` is the first *content* token (not
    the role chunk); for non-streamed requests it equals `e2e_s`. `retry_after_s` is None when the
    answer had no `Retry-After` header. `max_tokens` is what the request asked for; `poisoned` says its
    text carried the poison marker (`bench.faults`).
    """

    index: int
    scheduled_s: float
    sent_s: float
    status: int
    ok: bool
    e2e_s: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    frames: int = 0
    max_gap_s: float | None = None
    replica: str | None = None
    route: str | None = None
    reject_reason: str | None = None
    retry_after_s: float | None = None
    error: str | None = None
    priority: str | None = None
    group: str | None = None
    attempts: int = 1
    warmup: bool = False
    max_tokens: int | None = None
    poisoned: bool = False

    @property
    def done_s(self) -> float:
        return self.sent_s + self.e2e_s

    @property
    def lag_s(self) -> float:
        """How late the client sent it (client overload, or a session waiting for its previous turn)."""
        return max(0.0, self.sent_s - self.scheduled_s)

    @property
    def rejected(self) -> bool:
        """Shed by load control: a 429 or 503 answer (reason in `reject_reason`)."""
        return not self.ok and self.status in (429, 503)

    @property
    def outcome(self) -> str:
        """`ok`, or why not: the `x-gateway-reject-reason`, else `http_<status>`, else the error kind."""
        if self.ok:
            return "ok"
        if self.reject_reason:
            return self.reject_reason
        if self.status and self.status != 200:
            return f"http_{self.status}"
        return self.error or "error"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Sample:
        return cls(**row)
