"""The write watch's rule: is a client that has a response under way still taking it fast enough?

Fed one sample of the connection's TCP state every quarter of `write_timeout_s` (by
`gateway.api.connection_guard.GuardedProtocol`, from TCP_INFO on Linux): bytes the client acknowledged,
bytes in flight (sent, not acknowledged), bytes the kernel holds unsent, and bytes still in the
transport's own buffer. Two verdicts end the connection (reset, seen by the request as a disconnect):

- `write`: bytes wait (in flight, unsent or buffered) and none was acknowledged for `write_timeout_s`;
- `slow_read`: the kernel or the transport held unsent bytes at every sample for `write_timeout_s`
  (the client's window or link is the limit, not the engine) and the client acknowledged less than
  `min_read_bytes_per_s` × that time (0 turns the rule off). Bytes in flight to a client that keeps up
  with a slow engine are never unsent, so a slow engine is never blamed on its reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["write", "slow_read"]


@dataclass(slots=True)
class WriteWatch:
    """One connection's progress between samples (module docstring)."""

    write_timeout_s: float
    min_read_bytes_per_s: float = 0.0
    _acked: int = -1
    _progress_s: float = 0.0
    _held_since: tuple[float, int] | None = None
    """When the kernel began holding unsent bytes at every sample, and what was acknowledged then."""

    def restart(self, now_s: float) -> None:
        """A new response is under way (a request's headers are in): progress counts from now."""
        self._acked, self._progress_s, self._held_since = -1, now_s, None

    def sample(
        self, now_s: float, *, acked: int, in_flight: int, unsent: int, buffered: int
    ) -> Verdict | None:
        """One sample; a verdict when the connection should be reset, else None."""
        if acked != self._acked or in_flight + buffered == 0:
            self._acked, self._progress_s = acked, now_s
        elif now_s - self._progress_s >= self.write_timeout_s:
            return "write"
        return "slow_read" if self._reads_too_slowly(acked, unsent + buffered > 0, now_s) else None

    def _reads_too_slowly(self, acked: int, held: bool, now_s: float) -> bool:
        rate = self.min_read_bytes_per_s
        if rate <= 0 or not held:
            self._held_since = None
            return False
        if self._held_since is None:
            self._held_since = (now_s, acked)
            return False
        since_s, since_acked = self._held_since
        if now_s - since_s < self.write_timeout_s:
            return False
        self._held_since = (now_s, acked)
        return acked - since_acked < rate * (now_s - since_s)
