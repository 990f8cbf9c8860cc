"""Mean slot hold time per key (per replica), for waits that depend on one replica's releases.

The release forecast's S is one mean over every completed ticket of a pool. A replica that serves
longer contexts, or misses the prefix cache more often, holds its slots longer than that, and a wait
for *its* next slot (`router.prefix_wait`: W = (ahead + 1) × S / inflight) is then underestimated. So
each hold is also timed for the key it was dispatched with (the replica id), and a key's mean is
readable once it has `min_samples` holds:

    n-th hold h of key k:  mean_k += a_n × (h − mean_k),   a_n = max(smoothing, 1 / n)

— the plain mean of the first 1/smoothing holds (no weight left on the first sample, as a plain
exponential mean started at it would keep), then exponentially weighted like the pool's S (smoothing
0.05: about the last 20 count). Defaults: `min_samples` 10 (below it the caller falls back to the
pool's S), `max_keys` 1024.

Memory is bounded: at most `max_keys` keys, the least recently recorded one dropped to make room. A
replica removed from its pool is never recorded again, so it goes first; a key re-used by a new
replica (same address) inherits the old mean until its own holds move it. Reads are O(1); the object
is a read-only `Mapping` (key → mean seconds) of the keys with enough samples, so it can be handed to
`router.prefix_wait` as is. Durations come from the caller (the forecast's injected clock).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

DEFAULT_MIN_SAMPLES = 10
DEFAULT_MAX_KEYS = 1024


@dataclass(slots=True)
class _Mean:
    samples: int
    mean_s: float


class HoldTimesByKey(Mapping[str, float]):
    """key → mean hold seconds, for keys with at least `min_samples` holds (module docstring)."""

    def __init__(
        self, smoothing: float, min_samples: int = DEFAULT_MIN_SAMPLES, max_keys: int = DEFAULT_MAX_KEYS
    ) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1] (got {smoothing})")
        if min_samples < 1 or max_keys < 1:
            raise ValueError(f"min_samples and max_keys must be ≥ 1 (got {min_samples}, {max_keys})")
        self._smoothing = smoothing
        self._min_samples = min_samples
        self._max_keys = max_keys
        self._means: OrderedDict[str, _Mean] = OrderedDict()

    def record(self, key: str, hold_s: float) -> None:
        """One hold of `hold_s` seconds ended on `key` (it becomes the most recently recorded key)."""
        mean = self._means.get(key)
        if mean is None:
            self._means[key] = _Mean(1, hold_s)
            if len(self._means) > self._max_keys:
                self._means.popitem(last=False)
            return
        self._means.move_to_end(key)
        mean.samples += 1
        mean.mean_s += max(self._smoothing, 1.0 / mean.samples) * (hold_s - mean.mean_s)

    def samples(self, key: str) -> int:
        """Holds recorded for `key` (0 when unknown or dropped)."""
        mean = self._means.get(key)
        return 0 if mean is None else mean.samples

    def __getitem__(self, key: str) -> float:
        mean = self._means.get(key)
        if mean is None or mean.samples < self._min_samples:
            raise KeyError(key)
        return mean.mean_s

    def __iter__(self) -> Iterator[str]:
        return (key for key, mean in self._means.items() if mean.samples >= self._min_samples)

    def __len__(self) -> int:
        return sum(1 for mean in self._means.values() if mean.samples >= self._min_samples)
