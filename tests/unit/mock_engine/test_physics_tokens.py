"""Token estimate and chained prefix-block hashes."""

from __future__ import annotations

import pytest

from mock_engine.physics import estimate_tokens, prefix_block_hashes, split_prefix_blocks


def test_estimate_is_ceil_of_chars_over_four() -> None:
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5, 8, 4001)] == [0, 1, 1, 2, 2, 1001]


def test_split_keeps_only_full_blocks_of_block_size_times_four_chars() -> None:
    text = "a" * 64 + "b" * 64 + "c" * 10
    assert split_prefix_blocks(text, 16) == ["a" * 64, "b" * 64]
    assert split_prefix_blocks(text, 16, max_blocks=1) == ["a" * 64]
    with pytest.raises(ValueError):
        split_prefix_blocks(text, 0)


def test_hashes_are_chained_so_a_block_key_depends_on_everything_before_it() -> None:
    shared = "s" * 128
    first = prefix_block_hashes(shared + "x" * 64 + "z" * 64, 16)
    second = prefix_block_hashes(shared + "y" * 64 + "z" * 64, 16)
    assert first[:2] == second[:2]
    assert first[2] != second[2]
    assert first[3] != second[3]  # same block text, different history


def test_hashes_are_deterministic_and_unicode_safe() -> None:
    text = "héllo wörld ✓ " * 40
    assert prefix_block_hashes(text, 4) == prefix_block_hashes(text, 4)
    assert len(prefix_block_hashes(text, 4)) == len(text) // 16
