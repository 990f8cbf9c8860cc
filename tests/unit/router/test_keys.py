"""Routing keys: canonical text, chained block hashes, prefix key, session key, request builder."""

from __future__ import annotations

import pytest
import xxhash

from router.keys import (
    KeySettings,
    block_hashes,
    build_routing_keys,
    build_routing_request,
    canonical_prompt_text,
    prefix_key_of,
    render_chat_messages,
    render_completion_prompt,
    session_key_of,
)

SMALL = KeySettings(block_size_chars=4, max_prefix_chars=64, prefix_key_blocks=2)


class TestChatRendering:
    def test_messages_are_role_tagged_in_order(self) -> None:
        text = render_chat_messages(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        )
        assert text == "<|user|>\nhi\n<|assistant|>\nhello\n"

    def test_system_and_developer_messages_come_first_in_stable_order(self) -> None:
        text = render_chat_messages(
            [
                {"role": "user", "content": "u"},
                {"role": "system", "content": "s1"},
                {"role": "developer", "content": "d"},
                {"role": "system", "content": "s2"},
            ]
        )
        assert text == "<|system|>\ns1\n<|developer|>\nd\n<|system|>\ns2\n<|user|>\nu\n"

    def test_content_parts_render_text_and_digest_other_parts(self) -> None:
        def with_image(url: str) -> str:
            return render_chat_messages(
                [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "look"},
                            {"type": "image_url", "image_url": {"url": url}},
                        ],
                    }
                ]
            )

        first, second = with_image("http://a/1.png"), with_image("http://a/2.png")
        assert first.startswith("<|user|>\nlook\n<|image_url:")
        assert first != second
        assert first == with_image("http://a/1.png")

    def test_missing_content_and_junk_entries_are_tolerated(self) -> None:
        text = render_chat_messages([{"role": "assistant", "content": None}, "junk", {"role": "user"}])
        assert text == "<|assistant|>\n\n<|user|>\n\n"

    def test_not_a_list_renders_empty(self) -> None:
        assert render_chat_messages({"role": "user"}) == ""


class TestCompletionRendering:
    @pytest.mark.parametrize(
        ("prompt", "expected"),
        [
            ("plain", "plain"),
            (["a", "b"], "a\nb"),
            ([1, 2, 3], "1 2 3"),
            ([[1, 2], [3]], "1 2\n3"),
            (None, ""),
            ({"x": 1}, ""),
            ([True, False], "\n"),
        ],
    )
    def test_prompt_shapes(self, prompt: object, expected: str) -> None:
        assert render_completion_prompt(prompt) == expected

    def test_canonical_text_prefers_messages_then_prompt_then_input(self) -> None:
        assert canonical_prompt_text({"messages": [{"role": "user", "content": "m"}], "prompt": "p"}) == (
            "<|user|>\nm\n"
        )
        assert canonical_prompt_text({"prompt": "p", "input": "i"}) == "p"
        assert canonical_prompt_text({"input": ["i", "j"]}) == "i\nj"
        assert canonical_prompt_text({}) == ""


class TestBlockHashes:
    def test_one_hash_per_block_with_a_partial_last_block(self) -> None:
        assert len(block_hashes("m", "abcdefghij", SMALL)) == 3
        assert block_hashes("m", "", SMALL) == ()

    def test_shared_prefix_shares_leading_hashes_and_chaining_separates_the_rest(self) -> None:
        first = block_hashes("m", "aaaabbbbccccdddd", SMALL)
        second = block_hashes("m", "aaaaXbbbccccdddd", SMALL)
        assert first[0] == second[0]
        assert all(a != b for a, b in zip(first[1:], second[1:], strict=True))

    def test_model_name_seeds_the_chain(self) -> None:
        assert block_hashes("m1", "aaaa", SMALL) != block_hashes("m2", "aaaa", SMALL)

    def test_prefix_is_capped_at_max_prefix_chars(self) -> None:
        hashes = block_hashes("m", "x" * 1000, SMALL)
        assert len(hashes) == SMALL.max_prefix_chars // SMALL.block_size_chars
        assert hashes == block_hashes("m", "x" * 64 + "different tail", SMALL)

    def test_lone_surrogates_do_not_raise(self) -> None:
        assert len(block_hashes("m", "ab\ud800cd", SMALL)) == 2

    @pytest.mark.parametrize(
        "text",
        [
            "",
            "abc",
            "abcdefghij" * 10,
            "héllo wörld, ünïcode blocks",
            "ab\ud800cd" * 3,
            "x" * 63 + "é" + "y" * 9,
        ],
    )
    def test_hashes_follow_the_formula_for_ascii_and_other_text(self, text: str) -> None:
        """Block i is characters [i·B, (i+1)·B) of the capped text, encoded alone (the ASCII fast path
        hashes slices of one encoding: the same bytes)."""
        capped = text[: SMALL.max_prefix_chars]
        chained = xxhash.xxh3_64_intdigest(b"m")
        expected = []
        for start in range(0, len(capped), SMALL.block_size_chars):
            block = capped[start : start + SMALL.block_size_chars].encode("utf-8", "surrogatepass")
            chained = xxhash.xxh3_64_intdigest(block, seed=chained)
            expected.append(chained)
        assert block_hashes("m", text, SMALL) == tuple(expected)

    def test_defaults(self) -> None:
        settings = KeySettings()
        assert (settings.block_size_chars, settings.max_prefix_chars, settings.prefix_key_blocks) == (
            64,
            16384,
            16,
        )


class TestPrefixAndSessionKeys:
    def test_prefix_key_is_the_hash_of_the_first_k_blocks(self) -> None:
        assert prefix_key_of((1, 2, 3), 2) == 2
        assert prefix_key_of((1,), 2) == 1
        assert prefix_key_of((), 2) is None

    def test_requests_sharing_the_first_k_blocks_share_the_key(self) -> None:
        first = build_routing_keys("m", "aaaabbbb-tail-one", SMALL)
        second = build_routing_keys("m", "aaaabbbb-another-tail", SMALL)
        assert first.prefix_key == second.prefix_key
        assert first.prefix_hashes != second.prefix_hashes

    def test_session_key_header_wins_then_user_then_none(self) -> None:
        assert session_key_of("hdr", "user-1") == "hdr"
        assert session_key_of("  ", "user-1") == "user-1"
        assert session_key_of(None, " user-1 ") == "user-1"
        assert session_key_of(None, 42) is None
        assert session_key_of(None, "") is None


class TestRoutingRequestBuilder:
    def test_fills_keys_and_estimates_prompt_tokens(self) -> None:
        request = build_routing_request(
            "m", "abcdefghij", SMALL, session_key="s", max_tokens=5, exclude=frozenset({"r1"})
        )
        assert request.prefix_hashes == block_hashes("m", "abcdefghij", SMALL)
        assert request.prefix_key == request.prefix_hashes[1]
        assert request.session_key == "s"
        assert request.estimated_prompt_tokens == 3
        assert request.estimated_total_tokens == 8
        assert request.exclude == frozenset({"r1"})

    def test_explicit_token_estimate_and_default_settings(self) -> None:
        request = build_routing_request("m", "x" * 100, estimated_prompt_tokens=7)
        assert request.estimated_prompt_tokens == 7
        assert len(request.prefix_hashes) == 2
        assert request.prefix_key == request.prefix_hashes[-1]


class TestKeySettings:
    def test_from_options_reads_its_names_and_ignores_others(self) -> None:
        settings = KeySettings.from_options({"block_size_chars": 32, "load_factor": 2.0})
        assert settings == KeySettings(block_size_chars=32)

    @pytest.mark.parametrize(
        "options",
        [{"block_size_chars": 0}, {"max_prefix_chars": "big"}, {"prefix_key_blocks": True}],
    )
    def test_bad_values_name_the_option(self, options: dict[str, object]) -> None:
        (name,) = options
        with pytest.raises(ValueError, match=name):
            KeySettings.from_options(options)

    def test_direct_construction_validates(self) -> None:
        with pytest.raises(ValueError, match="block_size_chars"):
            KeySettings(block_size_chars=0)


def test_routing_keys_never_recurse_on_a_clients_nesting() -> None:
    """Defence in depth behind the edge's nesting limit: 5,000 nested arrays render without recursion."""
    value: object = "x"
    for _ in range(5000):
        value = [value]
    text = canonical_prompt_text(
        {"messages": [{"role": "user", "content": [{"type": "image", "image": value}]}]}
    )
    assert text.startswith("<|user|>\n<|image:") and text == canonical_prompt_text(
        {"messages": [{"role": "user", "content": [{"type": "image", "image": value}]}]}
    )
    assert render_completion_prompt([[1, 2], [[3]]]) == "1 2\n"
