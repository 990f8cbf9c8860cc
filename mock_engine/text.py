"""Deterministic output text for the mock engine.

Output token k of a request is a word chosen by a stable hash of (prompt, k), so the same request always
produces the same text. Token estimates (`ceil(len(text) / 4)`, the gateway's rule too) have one home,
`mock_engine.physics.tokens`, re-exported here for the server.
"""

from __future__ import annotations

import zlib

from mock_engine.physics.tokens import CHARS_PER_TOKEN, estimate_tokens

__all__ = ["CHARS_PER_TOKEN", "estimate_tokens", "prompt_seed", "token_text"]

_WORDS = (
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


def token_text(prompt_seed: int, index: int) -> str:
    """The text of output token `index` (a leading space, then a word)."""
    word = _WORDS[zlib.crc32(index.to_bytes(4, "little"), prompt_seed) % len(_WORDS)]
    return " " + word


def prompt_seed(prompt: str) -> int:
    return zlib.crc32(prompt.encode())
