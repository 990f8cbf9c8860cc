"""Deterministic token estimation and prefix-cache block keys, computed from text alone.

The mock engine has no tokenizer. It uses one documented rule everywhere:

    tokens(text) = ceil(len(text) / 4)          (len counts Unicode code points; "" → 0 tokens)

so a block of `block_size_tokens` tokens is `block_size_tokens · 4` characters. A prompt is split into
*full* blocks only (a trailing partial block is never cached, as in vLLM), and each block gets a chained
hash, so a block's key depends on every character before it:

    h₀ = xxh3_64(block₀, seed=s)                s = 0 for the base model,
    hᵢ = xxh3_64(blockᵢ, seed=hᵢ₋₁)                 xxh3_64("lora:" + adapter name) for a LoRA adapter

(blocks encoded as UTF-8). Two prompts share the cache key of block i exactly when they run on the same
model (base or adapter) and their first (i + 1) · block chars are equal: as vLLM's block hashes carry the
LoRA id, a prompt cached under the base model is a miss for an adapter, and the reverse.
"""

from __future__ import annotations

import xxhash

from core.tokens import CHARS_PER_TOKEN, estimate_tokens

__all__ = ["CHARS_PER_TOKEN", "adapter_salt", "estimate_tokens", "prefix_block_hashes", "split_prefix_blocks"]


def split_prefix_blocks(text: str, block_size_tokens: int, max_blocks: int | None = None) -> list[str]:
    """The full blocks of `text`, each `block_size_tokens · 4` characters; a partial tail is dropped.

    `max_blocks` caps the count (e.g. at prompt_tokens // block_size when the caller's token count is
    smaller than the estimate).
    """
    if block_size_tokens < 1:
        raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
    block_chars = block_size_tokens * CHARS_PER_TOKEN
    n_blocks = len(text) // block_chars
    if max_blocks is not None:
        n_blocks = min(n_blocks, max(max_blocks, 0))
    return [text[i * block_chars : (i + 1) * block_chars] for i in range(n_blocks)]


def adapter_salt(adapter: str | None) -> int:
    """The seed of a prompt's first block hash: 0 for the base model (None), else from the adapter name."""
    return 0 if adapter is None else xxhash.xxh3_64_intdigest(("lora:" + adapter).encode("utf-8"))


def prefix_block_hashes(
    text: str, block_size_tokens: int, max_blocks: int | None = None, adapter: str | None = None
) -> list[int]:
    """Chained xxh3-64 hashes of the full blocks of `text` run on `adapter` (see the module docstring)."""
    hashes: list[int] = []
    previous = adapter_salt(adapter)
    for block in split_prefix_blocks(text, block_size_tokens, max_blocks):
        previous = xxhash.xxh3_64_intdigest(block.encode("utf-8"), seed=previous)
        hashes.append(previous)
    return hashes
