"""The mock's text model and how a generation request is read: determinism, prefix-exact continuation,
the position a continued run has reached, and the 400s of invalid continuations (pure, no server)."""

from __future__ import annotations

from typing import Any

import pytest

from mock_engine.generation import GENERATION_PROMPT, Generation, RequestError
from mock_engine.text import WORDS, TokenStream, estimate_tokens, own_output_run

DEFAULT_MAX = 16


def _gen(body: dict[str, Any], chat: bool = True) -> Generation:
    return Generation.from_body(body, chat, DEFAULT_MAX)


def _chat(*messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in messages], **extra}


def _text(gen: Generation) -> str:
    return "".join(gen.tokens().take(gen.max_tokens))


# --- the text model ----------------------------------------------------------------------------------


def test_same_context_same_tokens_and_every_token_is_a_vocabulary_word() -> None:
    one, two = TokenStream("hello").take(200), TokenStream("hello").take(200)
    assert one == two
    assert all(t.startswith(" ") and t[1:] in WORDS for t in one)
    assert len(set(one)) > 20, "the text varies"
    assert one != TokenStream("hellp").take(200)


def test_the_seed_changes_the_text_and_no_seed_is_its_own_stream() -> None:
    assert TokenStream("p", 1).take(30) == TokenStream("p", 1).take(30)
    assert TokenStream("p", 1).take(30) != TokenStream("p", 2).take(30)
    assert TokenStream("p", None).take(30) != TokenStream("p", 1).take(30)


@pytest.mark.parametrize("k", [0, 1, 2, 7, 31, 99])
@pytest.mark.parametrize("seed", [None, 0, 12345])
def test_generating_after_the_first_k_tokens_gives_the_rest(k: int, seed: int | None) -> None:
    unbroken = TokenStream("a prompt", seed).take(100)
    rest = TokenStream("a prompt" + "".join(unbroken[:k]), seed).take(100 - k)
    assert unbroken[:k] + rest == unbroken


def test_own_output_run_counts_the_models_own_trailing_tokens() -> None:
    out = TokenStream("ctx", 5).take(12)
    text = "".join(out)
    assert own_output_run("ctx", text, 5) == (12, True)
    assert own_output_run("ctx", "", 5) == (0, True)
    assert own_output_run("ctx", text, 6)[1] is False, "another seed's model did not say that"
    assert own_output_run("ctx", text[:-1], 5) == (0, False), "cut mid-word: the last piece is no token"
    # a foreign prefix: only the trailing own tokens (read after that prefix) count
    foreign = " nonsense"
    after = "".join(TokenStream("ctx" + foreign, 5).take(4))
    assert own_output_run("ctx", foreign + after, 5) == (4, False)


# --- chat requests -----------------------------------------------------------------------------------


def test_a_plain_chat_request_is_unchanged_in_shape() -> None:
    gen = _gen(_chat(("system", "be brief"), ("user", "hello")))
    assert gen.prompt == "be brief\nhello" and gen.prompt_tokens == estimate_tokens("be brief\nhello")
    assert gen.context.endswith(GENERATION_PROMPT) and gen.position == 0
    assert (gen.max_tokens, gen.finish_reason) == (DEFAULT_MAX, "stop")
    assert _gen(_chat(("user", "hello"), max_tokens=5)).max_tokens == 5


@pytest.mark.parametrize("k", [0, 1, 4, 9])
@pytest.mark.parametrize("seed", [None, 7])
def test_chat_continuation_is_the_rest_of_the_unbroken_run(k: int, seed: int | None) -> None:
    turns = (("system", "sys"), ("user", "q1"), ("assistant", "a1"), ("user", "q2"))
    extra = {} if seed is None else {"seed": seed}
    unbroken = _gen(_chat(*turns, max_tokens=10, **extra))
    tokens = unbroken.tokens().take(10)
    so_far = "".join(tokens[:k])
    cont = _gen(
        _chat(
            *turns,
            ("assistant", so_far),
            max_tokens=10 - k,
            continue_final_message=True,
            add_generation_prompt=False,
            **extra,
        )
    )
    assert cont.position == k and cont.max_tokens == 10 - k and cont.finish_reason == "length"
    assert so_far + _text(cont) == "".join(tokens)
    assert cont.prompt == unbroken.prompt + "\n" + so_far, "the assistant text counts as prompt"


@pytest.mark.parametrize("k", [0, 3, DEFAULT_MAX - 1, DEFAULT_MAX])
def test_chat_continuation_without_max_tokens_stops_where_the_unbroken_run_stops(k: int) -> None:
    unbroken = _gen(_chat(("user", "hi")))
    full = _text(unbroken)
    so_far = "".join(unbroken.tokens().take(k))
    cont = _gen(_chat(("user", "hi"), ("assistant", so_far), continue_final_message=True))
    assert (cont.position, cont.max_tokens, cont.finish_reason) == (k, DEFAULT_MAX - k, "stop")
    assert so_far + _text(cont) == full


def test_a_foreign_assistant_text_continues_from_a_position_derived_from_its_length() -> None:
    text = " something another engine said"
    cont = _gen(_chat(("user", "hi"), ("assistant", text), continue_final_message=True))
    assert cont.position == estimate_tokens(text) == 8
    assert cont.max_tokens == DEFAULT_MAX - 8
    assert cont.context.endswith(GENERATION_PROMPT + text), "the model still reads that text"


def test_content_parts_are_read_as_their_text() -> None:
    parts = [
        {"type": "text", "text": "hel"},
        {"type": "image_url", "image_url": {}},
        {"type": "text", "text": "lo"},
    ]
    gen = _gen({"messages": [{"role": "user", "content": parts}]})
    assert gen.prompt == "hello" and gen.context == _gen(_chat(("user", "hello"))).context


def test_add_generation_prompt_false_without_continuation_reads_no_generation_prompt() -> None:
    gen = _gen(_chat(("user", "hi"), add_generation_prompt=False))
    assert not gen.context.endswith(GENERATION_PROMPT) and gen.position == 0


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (
            _chat(("user", "q"), ("assistant", "x"), continue_final_message=True, add_generation_prompt=True),
            "add_generation_prompt",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        ),
        (
            _chat(("user", "q"), continue_final_message=True),
            "continue_final_message",
            "not from the assistant",
        ),
        (
            {"messages": [], "continue_final_message": True},
            "continue_final_message",
            "not from the assistant",
        ),
        (_chat(("user", "q"), continue_final_message="yes"), "continue_final_message", "true or false"),
        (_chat(("user", "q"), add_generation_prompt=1), "add_generation_prompt", "true or false"),
        (_chat(("user", "q"), seed="7"), "seed", "seed must be an integer"),
        (_chat(("user", "q"), seed=True), "seed", "seed must be an integer"),
        (_chat(("user", "q"), max_tokens="many"), "max_tokens", "must be an integer"),
        (_chat(("user", "q"), max_tokens=0), "max_tokens", "at least 1, got 0"),
        (_chat(("user", "q"), max_completion_tokens=-2, max_tokens=5), "max_completion_tokens", "at least 1"),
        ({"messages": "hi"}, "messages", "array"),
    ],
)
def test_invalid_requests_name_the_field(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(RequestError) as caught:
        _gen(body)
    assert caught.value.param == param and words in str(caught.value)


def test_continuation_with_the_generation_prompt_omitted_is_accepted() -> None:
    gen = _gen(_chat(("user", "q"), ("assistant", ""), continue_final_message=True))
    assert gen.position == 0 and gen.context == _gen(_chat(("user", "q"))).context


# --- completions requests ----------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 1, 5, 11])
@pytest.mark.parametrize("seed", [None, 3])
def test_completions_continuation_is_the_rest_of_the_unbroken_run(k: int, seed: int | None) -> None:
    extra = {} if seed is None else {"seed": seed}
    prompt = "Once upon a time"
    unbroken = _gen({"prompt": prompt, "max_tokens": 12, **extra}, chat=False)
    full = _text(unbroken)
    so_far = "".join(unbroken.tokens().take(k))
    cont = _gen({"prompt": prompt + so_far, "max_tokens": 12 - k, **extra}, chat=False)
    assert cont.position == k and so_far + _text(cont) == full
    assert cont.prompt_tokens == estimate_tokens(prompt + so_far)


@pytest.mark.parametrize("k", [0, 2, DEFAULT_MAX])
def test_completions_continuation_without_max_tokens_stops_with_the_unbroken_run(k: int) -> None:
    unbroken = _gen({"prompt": "x"}, chat=False)
    full = _text(unbroken)
    so_far = "".join(unbroken.tokens().take(k))
    cont = _gen({"prompt": "x" + so_far}, chat=False)
    assert (cont.position, cont.max_tokens, cont.finish_reason) == (k, DEFAULT_MAX - k, "stop")
    assert so_far + _text(cont) == full


def test_a_completions_prompt_ending_in_other_words_starts_a_fresh_run() -> None:
    gen = _gen({"prompt": "tell me about the weather"}, chat=False)
    assert gen.position == 0 and gen.max_tokens == DEFAULT_MAX
    assert _gen({"prompt": None}, chat=False).prompt == ""
