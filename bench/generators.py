"""The workload generators. Each is a frozen config whose `requests(seed)` is an infinite, deterministic
iterator of `RequestSpec` (the runner takes as many as the run needs).

- `SharedPrefix`: `groups` system prompts of `prefix_tokens`, each followed by questions of
  `question_tokens`; every round of `groups × prompts_per_group` requests holds each group exactly
  `prompts_per_group` times, in a seeded shuffled order (later rounds draw fresh questions).
- `MultiTurn`: chat threads that grow turn by turn (system, user₁, assistant₁, user₂, …); `active`
  conversations are served round-robin, each with its own `session_id`; a finished thread (after
  `turns` turns) is replaced by a new one. Assistant turns are synthesised text of `output_tokens`
  (the real answer is not fed back, so the generator stays pure; the prefix each turn shares with the
  previous one is the same either way).
- `ZipfPrefixes`: `prefixes` distinct prefixes, the k-th hottest chosen with P ∝ 1/k^exponent.
- `NoSharing`: every prompt is fresh random text (the control).
- `LongContextMix`: fresh prompts, a `long_fraction` of them `long_tokens` long, the rest `short_tokens`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from bench.workload import RequestSpec, synthetic_text, zipf_sampler


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    groups: int = 64
    prompts_per_group: int = 16
    prefix_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 256
    name: str = "shared-prefix"

    def requests(self, seed: int) -> Iterator[RequestSpec]:
        _at_least_one(groups=self.groups, prompts_per_group=self.prompts_per_group)
        rng = random.Random(f"{self.name}-{seed}")
        prefixes = [synthetic_text(rng, self.prefix_tokens) for _ in range(self.groups)]
        while True:
            order = [g for g in range(self.groups) for _ in range(self.prompts_per_group)]
            rng.shuffle(order)
            for group in order:
                yield RequestSpec(
                    messages=(
                        ("system", prefixes[group]),
                        ("user", synthetic_text(rng, self.question_tokens)),
                    ),
                    max_tokens=self.output_tokens,
                    group=f"g{group}",
                )

    def describe(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class MultiTurn:
    active: int = 32
    turns: int = 8
    system_tokens: int = 256
    user_tokens: int = 64
    output_tokens: int = 128
    name: str = "multi-turn"

    def requests(self, seed: int) -> Iterator[RequestSpec]:
        _at_least_one(active=self.active, turns=self.turns)
        rng = random.Random(f"{self.name}-{seed}")
        started = 0

        def new_thread() -> tuple[str, list[tuple[str, str]]]:
            nonlocal started
            started += 1
            return f"{seed}-c{started - 1}", [("system", synthetic_text(rng, self.system_tokens))]

        threads = [new_thread() for _ in range(self.active)]
        while True:
            # A fresh seeded order each round: a fixed cycle of `active` threads would make round robin
            # over a replica count dividing `active` pin every thread to one replica (accidental affinity).
            for slot in rng.sample(range(self.active), self.active):
                session, history = threads[slot]
                history.append(("user", synthetic_text(rng, self.user_tokens)))
                yield RequestSpec(
                    messages=tuple(history),
                    max_tokens=self.output_tokens,
                    session_id=session,
                    group=session,
                )
                history.append(("assistant", synthetic_text(rng, self.output_tokens)))
                if len(history) // 2 >= self.turns:
                    threads[slot] = new_thread()

    def describe(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ZipfPrefixes:
    prefixes: int = 256
    exponent: float = 1.1
    prefix_tokens: int = 1024
    question_tokens: int = 128
    output_tokens: int = 128
    name: str = "zipf"

    def requests(self, seed: int) -> Iterator[RequestSpec]:
        _at_least_one(prefixes=self.prefixes)
        rng = random.Random(f"{self.name}-{seed}")
        texts = [synthetic_text(rng, self.prefix_tokens) for _ in range(self.prefixes)]
        for rank in zipf_sampler(random.Random(f"{self.name}-ranks-{seed}"), self.prefixes, self.exponent):
            yield RequestSpec(
                messages=(("system", texts[rank]), ("user", synthetic_text(rng, self.question_tokens))),
                max_tokens=self.output_tokens,
                group=f"p{rank}",
            )

    def describe(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class NoSharing:
    prompt_tokens: int = 1024
    output_tokens: int = 128
    name: str = "no-sharing"

    def requests(self, seed: int) -> Iterator[RequestSpec]:
        rng = random.Random(f"{self.name}-{seed}")
        while True:
            text = synthetic_text(rng, self.prompt_tokens)
            yield RequestSpec(messages=(("user", text),), max_tokens=self.output_tokens)

    def describe(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class LongContextMix:
    short_tokens: int = 256
    long_tokens: int = 8192
    long_fraction: float = 0.1
    output_tokens: int = 128
    name: str = "long-context"

    def requests(self, seed: int) -> Iterator[RequestSpec]:
        if not 0.0 <= self.long_fraction <= 1.0:
            raise ValueError(f"long_fraction must be in [0, 1], got {self.long_fraction}")
        rng = random.Random(f"{self.name}-{seed}")
        while True:
            is_long = rng.random() < self.long_fraction
            text = synthetic_text(rng, self.long_tokens if is_long else self.short_tokens)
            yield RequestSpec(
                messages=(("user", text),),
                max_tokens=self.output_tokens,
                group="long" if is_long else "short",
            )

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def _at_least_one(**values: int) -> None:
    for key, value in values.items():
        if value < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
