"""Deterministic output text for the mock engine: a tiny autoregressive "model".

Each output token is a leading space and one word of a fixed 32-word vocabulary. The next token is a pure
function of the whole context so far (the prompt as the model reads it, then the tokens already produced)
and of the request's `seed`:

    state₀     = crc32(context)                          (UTF-8)
    tokenᵢ     = " " + WORDS[choose(stateᵢ, seed)]
    stateᵢ₊₁   = crc32(tokenᵢ, stateᵢ)                   (= crc32(context + token₀ … tokenᵢ))

so the state after i tokens is the CRC of the text the model has read, as a language model's next token
depends on everything before it. Continuation is therefore exact by construction: generating from
`context + token₀ … tokenₖ₋₁` yields tokenₖ, tokenₖ₊₁, … — the rest of the unbroken run — for any k.

`own_output_run` finds how many trailing tokens of a text are the model's own output (each one what the
model would have said at that point); the server uses it to know how far a continued generation already is
(its position k), which only matters for where the natural stop falls (see `generation.py`).

Token estimates (`ceil(len(text) / 4)`, the gateway's rule too) have one home,
`mock_engine.physics.tokens`, re-exported here for the server.
"""

from __future__ import annotations

import zlib

from mock_engine.physics.tokens import CHARS_PER_TOKEN, estimate_tokens

__all__ = [
    "CHARS_PER_TOKEN",
    "WORDS",
    "TokenStream",
    "estimate_tokens",
    "own_output_run",
    "prompt_seed",
    "seed_salt",
]

WORDS = (
    "the",
    "gateway",
    "routes",
    "tokens",
    "to",
    "a",
    "replica",
    "with",
    "free",
    "cache",
    "and",
    "keeps",
    "latency",
    "low",
    "while",
    "batches",
    "grow",
    "under",
    "load",
    "so",
    "every",
    "request",
    "meets",
    "its",
    "deadline",
    "prefix",
    "blocks",
    "stay",
    "warm",
    "on",
    "GPU",
    "memory",
)
_VOCABULARY = frozenset(WORDS)
_MASK32 = 0xFFFFFFFF
_GOLDEN32 = 0x9E3779B1


def seed_salt(seed: int | None) -> int:
    """The 32-bit salt the request's `seed` mixes into every choice (0 without a seed)."""
    return 0 if seed is None else zlib.crc32(b"seed:" + str(seed).encode())


def _choose(state: int, salt: int) -> str:
    """The word the model says in `state`: the top bits of a multiplicative hash of state ⊕ salt."""
    mixed = ((state ^ salt) * _GOLDEN32) & _MASK32
    return WORDS[(mixed * len(WORDS)) >> 32]


class TokenStream:
    """The tokens the model generates after `context` (see the module docstring), one `next()` at a time."""

    __slots__ = ("_salt", "_state")

    def __init__(self, context: str, seed: int | None = None) -> None:
        self._state = zlib.crc32(context.encode())
        self._salt = seed_salt(seed)

    def next(self) -> str:
        token = " " + _choose(self._state, self._salt)
        self._state = zlib.crc32(token.encode(), self._state)
        return token

    def take(self, n: int) -> list[str]:
        return [self.next() for _ in range(n)]


def own_output_run(head: str, tail: str, seed: int | None = None) -> tuple[int, bool]:
    """How many trailing tokens of `tail` the model would itself have produced, reading `head + tail`.

    Returns (run, whole): `run` counts the trailing " word" tokens of `tail` each equal to what the model
    says at that point of the context; `whole` is True when they make up all of `tail` (an empty tail is
    whole, with run 0). Costs one CRC over the context and O(trailing vocabulary tokens).
    """
    tokens: list[str] = []
    end = len(tail)
    while end > 0:
        space = tail.rfind(" ", 0, end)
        if space < 0 or tail[space + 1 : end] not in _VOCABULARY:
            break
        tokens.append(tail[space:end])
        end = space
    tokens.reverse()
    salt = seed_salt(seed)
    state = zlib.crc32((head + tail[:end]).encode())
    run = 0
    for token in tokens:
        run = run + 1 if " " + _choose(state, salt) == token else 0
        state = zlib.crc32(token.encode(), state)
    return run, end == 0 and run == len(tokens)


def prompt_seed(prompt: str) -> int:
    """A stable 32-bit hash of a text (the embeddings' source)."""
    return zlib.crc32(prompt.encode())
