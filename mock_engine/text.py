"""Deterministic text and token estimates for the mock engine.

Token estimate: `ceil(len(text) / 4)` characters per token, at least 1 for non-empty text — the same rule
the gateway uses, so both sides agree on prompt sizes. Output token k of a request is a word chosen by
a stable hash of (prompt, k), so the same request always produces the same text.
"""

from __future__ import annotations

import zlib

CHARS_PER_TOKEN = 4
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


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def token_text(prompt_seed: int, index: int) -> str:
    """The text of output token `index` (a leading space, then a word)."""
    word = _WORDS[zlib.crc32(index.to_bytes(4, "little"), prompt_seed) % len(_WORDS)]
    return " " + word


def prompt_seed(prompt: str) -> int:
    return zlib.crc32(prompt.encode())
