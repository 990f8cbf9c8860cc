"""The prefix-cache oracle: a client-side router, straight to the engines, that sends each request to the
replica that already holds the longest prefix of its prompt — as if every replica's cache were infinite
and the router knew it exactly. It is the reference for a policy's hit ratio ("≥ 0.9× of an oracle").

Blocks are `block_chars` characters (16 tokens × 4 characters, the engines' block size) with chained
xxh3 hashes, so two prompts share block i exactly when their first (i + 1) blocks are equal. Ties
(including "no replica holds any prefix") go to the replica that has been sent the fewest requests, so
new prefixes spread evenly. It ignores load: it shows how much cache reuse is possible, not how fast.
"""

from __future__ import annotations

import xxhash

from bench.workload import RequestSpec

DEFAULT_BLOCK_CHARS = 64


def block_hashes(text: str, block_chars: int = DEFAULT_BLOCK_CHARS) -> list[int]:
    hashes = []
    previous = 0
    for start in range(0, len(text) - block_chars + 1, block_chars):
        previous = xxhash.xxh3_64_intdigest(text[start : start + block_chars].encode(), seed=previous)
        hashes.append(previous)
    return hashes


class PrefixOracle:
    def __init__(self, urls: list[str], block_chars: int = DEFAULT_BLOCK_CHARS) -> None:
        if not urls:
            raise ValueError("the oracle needs at least one engine")
        self.urls = urls
        self.block_chars = block_chars
        self._held: list[set[int]] = [set() for _ in urls]
        self._sent = [0] * len(urls)

    def matched_blocks(self, replica: int, hashes: list[int]) -> int:
        held = self._held[replica]
        count = 0
        for block in hashes:
            if block not in held:
                break
            count += 1
        return count

    def pick(self, spec: RequestSpec) -> str:
        hashes = block_hashes(spec.prompt_text(), self.block_chars)
        best = max(range(len(self.urls)), key=lambda i: (self.matched_blocks(i, hashes), -self._sent[i], -i))
        self._held[best].update(hashes)
        self._sent[best] += 1
        return self.urls[best]
