"""What a benchmark request is (`RequestSpec`), deterministic text of a given token length, and the
priority-mix wrapper shared by every workload.

Lengths are in tokens by the project's one estimate, `tokens = ceil(characters / 4)` (the gateway and the
mock engine use the same rule), so `synthetic_text(n)` is exactly 4·n characters. Texts are random words
from a fixed vocabulary drawn with the caller's seeded `random.Random`; two independently drawn texts
share no 64-character prefix block except with negligible probability, so only the sharing a workload
promises reaches the prefix caches.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from core.tokens import CHARS_PER_TOKEN, estimate_tokens

_SYLLABLES = ("ka", "lo", "mi", "ten", "ra", "vo", "shu", "pel", "dor", "ni", "qua", "zet", "bri", "um")
VOCABULARY: tuple[str, ...] = tuple(
    a + b + c for a, b, c in itertools.product(_SYLLABLES, _SYLLABLES, ("", "s", "n", "r"))
)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send: chat `messages` (role, content) or a completion `prompt`.

    `session_id` is sent as `x-session-id` (and serialises a conversation's turns in the runner);
    `priority` as `x-gateway-priority`; `group` names the shared prefix or conversation (analysis only);
    `at_s` is a trace's arrival offset; `poisoned`: the text carries the poison marker (`bench.faults`).
    """

    messages: tuple[tuple[str, str], ...] = ()
    prompt: str | None = None
    max_tokens: int = 64
    session_id: str | None = None
    priority: str | None = None
    group: str | None = None
    at_s: float | None = None
    poisoned: bool = False

    @property
    def chat(self) -> bool:
        return self.prompt is None

    def prompt_text(self) -> str:
        """The text an engine sees (the mock engine joins message contents with newlines)."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(content for _, content in self.messages)

    def prompt_tokens(self) -> int:
        return estimate_tokens(self.prompt_text())

    def body(self, model: str, stream: bool) -> dict[str, Any]:
        """The OpenAI request body; streams ask for usage so output tokens come from the engine."""
        body: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens, "stream": stream}
        if self.prompt is not None:
            body["prompt"] = self.prompt
        else:
            body["messages"] = [{"role": role, "content": content} for role, content in self.messages]
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.session_id is not None:
            headers["x-session-id"] = self.session_id
        if self.priority is not None:
            headers["x-gateway-priority"] = self.priority
        return headers

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"max_tokens": self.max_tokens}
        if self.prompt is not None:
            row["prompt"] = self.prompt
        else:
            row["messages"] = [{"role": r, "content": c} for r, c in self.messages]
        for key in ("session_id", "priority", "group", "at_s"):
            value = getattr(self, key)
            if value is not None:
                row[key] = value
        if self.poisoned:
            row["poisoned"] = True
        return row


class Workload(Protocol):
    """A pure request generator: the same seed gives the same requests, in the same order."""

    @property
    def name(self) -> str: ...

    def requests(self, seed: int) -> Iterator[RequestSpec]: ...

    def describe(self) -> dict[str, Any]: ...


def synthetic_text(rng: random.Random, tokens: int) -> str:
    """Random words, exactly `tokens · 4` characters (ends with a space-free cut)."""
    chars = tokens * CHARS_PER_TOKEN
    if chars <= 0:
        return ""
    words = rng.choices(VOCABULARY, k=chars // 4 + 2)
    text = " ".join(words)
    while len(text) < chars:
        text += " " + " ".join(rng.choices(VOCABULARY, k=chars // 4 + 2))
    return text[:chars]


def zipf_sampler(rng: random.Random, n: int, exponent: float) -> Iterator[int]:
    """Ranks 0 … n−1 with P(k) ∝ 1 / (k + 1)^exponent (rank 0 hottest), by inverse CDF."""
    if n < 1:
        raise ValueError(f"zipf needs n >= 1, got {n}")
    cumulative = list(itertools.accumulate(1.0 / (k + 1) ** exponent for k in range(n)))
    total = cumulative[-1]
    while True:
        yield min(n - 1, bisect.bisect_right(cumulative, rng.random() * total))


def parse_priority_mix(text: str) -> dict[str, float]:
    """`critical=0.1,interactive=0.6,batch=0.3` → weights (need not sum to 1)."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, weight = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"priority mix item {part!r} is not NAME=WEIGHT")
        mix[name.strip()] = float(weight)
        if mix[name.strip()] < 0:
            raise ValueError(f"priority weight must be >= 0 in {part!r}")
    if mix and sum(mix.values()) <= 0:
        raise ValueError("priority mix weights sum to 0")
    return mix


def with_priorities(
    specs: Iterator[RequestSpec], mix: Mapping[str, float], seed: int
) -> Iterator[RequestSpec]:
    """Assign each request a priority class drawn from `mix` (its own RNG stream, so the requests
    themselves are unchanged). A conversation keeps the class of its first turn."""
    if not mix:
        yield from specs
        return
    rng = random.Random(f"priority-{seed}")
    names = list(mix)
    weights = [mix[n] for n in names]
    by_session: dict[str, str] = {}
    for spec in specs:
        if spec.session_id is not None and spec.session_id in by_session:
            chosen = by_session[spec.session_id]
        else:
            chosen = rng.choices(names, weights)[0]
            if spec.session_id is not None:
                by_session[spec.session_id] = chosen
        yield replace(spec, priority=chosen)
