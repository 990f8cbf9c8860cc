"""One generation request as the mock engine reads it from its OpenAI body, continuations included.

The text comes from the deterministic autoregressive model of `text.py`: the next token is a function of
the context read so far and of the request's `seed`. Contexts:

- completions: the prompt itself;
- chat: the messages through a fixed template, each `<|role|>\\n` + content + `<|end|>\\n`, then the
  generation prompt `<|assistant|>\\n` (unless `add_generation_prompt` is false).

**Continuation** (what a gateway sends to resume a stream cut after k tokens, on any replica):

- chat: the original messages, then `{"role": "assistant", "content": <text so far>}`, with
  `"continue_final_message": true` and `"add_generation_prompt": false` (or omitted). The final assistant
  message is left open — rendered `<|assistant|>\\n` + content, no end marker — so the context is exactly
  the unbroken run's after k tokens, and the answer (only the new text, as vLLM) is the rest of that run.
  `continue_final_message` with `add_generation_prompt: true` is a 400, as in vLLM; so is it without a
  final assistant message.
- completions: the prompt is the original prompt + the text so far. The context is then the unbroken
  run's after k tokens, so the answer is again the rest of that run.

With `max_tokens` (or `max_completion_tokens`; at least 1, else 400 as in vLLM) the answer has exactly
that many tokens, finish "length" — so a run cut after all its tokens (k = max_tokens) is not continued:
it is complete, only its finish chunk is missing.
Without it, the model's natural stop ("stop") is at position `default_max_tokens` of the run, so the answer
has `default_max_tokens − k` tokens (never fewer than 0), k being the position already reached:

- chat: the number of tokens of the final assistant text when it is exactly the model's own output for the
  original messages (and seed); otherwise (text from elsewhere, edited, cut mid-word) `ceil(len / 4)`,
  the documented token estimate — the continuation is still what the model says after that text, only the
  stop position is approximate;
- completions: the trailing run of the prompt's tokens that are the model's own output (`own_output_run`).
  A prompt whose last words happen to be what the model would have said next counts them too (one chance
  in 32 per word), so without `max_tokens` such a prompt stops that much earlier.

Usage: `prompt_tokens` counts the whole prompt text (the text so far included, the chat contents joined
with "\\n"), `completion_tokens` only the new tokens.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from mock_engine import validation
from mock_engine.text import TokenStream, estimate_tokens, own_output_run
from mock_engine.validation import RequestError

__all__ = ["END_OF_TURN", "GENERATION_PROMPT", "Generation", "RequestError"]

GENERATION_PROMPT = "<|assistant|>\n"
END_OF_TURN = "<|end|>\n"


@dataclass(frozen=True, slots=True)
class Generation:
    """One generation request as parsed from its OpenAI body.

    `prompt` is the text the engine counts and caches (chat: the message contents joined with "\\n");
    `context` what the text model reads; `position` how many tokens of the run came before this request
    (0 unless it continues one); `max_tokens` how many tokens this request generates.
    """

    request_id: str
    response_id: str
    chat: bool
    prompt: str
    prompt_tokens: int
    context: str
    seed: int | None
    position: int
    max_tokens: int
    finish_reason: str
    include_usage: bool
    kv_transfer_s: float = 0.0
    """Simulated seconds the prompt's KV takes to arrive (a disaggregated decode leg; see `disagg_role`)."""
    adapter: str | None = None
    """The LoRA adapter it runs with, None for the base model (set once the server checked `model`)."""

    @classmethod
    def from_body(cls, body: dict[str, Any], chat: bool, default_max_tokens: int) -> Generation:
        """Raises `RequestError` for an invalid body (see the module docstring and `validation.py`)."""
        validation.common_fields(body)
        seed = _seed(body)
        if chat:
            prompt, context, position = _chat(body, seed)
        else:
            prompt = _completion_prompt(body)
            context, position = prompt, own_output_run("", prompt, seed)[0]
        requested = _max_tokens(body)
        request_id = uuid.uuid4().hex
        options = body.get("stream_options") or {}
        return cls(
            request_id=request_id,
            response_id=("chatcmpl-" if chat else "cmpl-") + request_id,
            chat=chat,
            prompt=prompt,
            prompt_tokens=estimate_tokens(prompt),
            context=context,
            seed=seed,
            position=position,
            max_tokens=requested if requested is not None else max(default_max_tokens - position, 0),
            finish_reason="length" if requested is not None else "stop",
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        )

    def tokens(self) -> TokenStream:
        """The tokens this request generates, in order."""
        return TokenStream(self.context, self.seed)


def _seed(body: dict[str, Any]) -> int | None:
    seed = body.get("seed")
    if seed is None:
        return None
    return validation.integer(seed, "seed")


def _max_tokens(body: dict[str, Any]) -> int | None:
    """The requested output length (`max_completion_tokens` first), None when unset; at least 1, as vLLM."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        tokens = validation.integer(value, name, numeric_string=True)
        if tokens < 1:
            raise RequestError(f"{name} must be at least 1, got {tokens}", name)
        return tokens
    return None


def _content(content: Any) -> str:
    """A message's text: a string, or the text parts of a content array; null is empty (the shape was
    checked by `validation.messages`)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and "text" in part
        )
    return str(content)


def _render(turns: list[tuple[str, str]]) -> str:
    return "".join(f"<|{role}|>\n{content}{END_OF_TURN}" for role, content in turns)


def _chat(body: dict[str, Any], seed: int | None) -> tuple[str, str, int]:
    """(prompt, context, position) of a chat request."""
    turns = [(role, _content(content)) for role, content in validation.messages(body.get("messages"))]
    prompt = "\n".join(content for _, content in turns)
    continue_final = validation.flag(body, "continue_final_message")
    add_generation_prompt = validation.flag(body, "add_generation_prompt")
    if not continue_final:
        context = _render(turns) + (GENERATION_PROMPT if add_generation_prompt is not False else "")
        return prompt, context, 0
    if add_generation_prompt:
        raise RequestError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "add_generation_prompt",
        )
    if not turns or turns[-1][0] != "assistant":
        raise RequestError(
            "Cannot set `continue_final_message` to True when the last message is not from the assistant.",
            "continue_final_message",
        )
    head, text = _render(turns[:-1]) + GENERATION_PROMPT, turns[-1][1]
    run, whole = own_output_run(head, text, seed)
    return prompt, head + text, run if whole else estimate_tokens(text)


def _completion_prompt(body: dict[str, Any]) -> str:
    return "".join(validation.prompt_texts(body.get("prompt"), "prompt"))
