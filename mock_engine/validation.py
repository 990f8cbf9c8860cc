"""The shapes the mock engine accepts for the request fields it reads, as vLLM's request models do.

A field of the wrong type raises `RequestError` naming it (`param`); the server answers it as vLLM does,
400 with `{"error": {"message", "type": "BadRequestError", "param", "code": 400}}`, before any fault
decision. A client's bad input must never look like an engine failure (a 500 counts against a replica).

- `model`: a string or null;
- `stream`, `continue_final_message`, `add_generation_prompt`: a boolean or null;
- `stream_options`: an object or null;
- `max_tokens`, `max_completion_tokens`, `seed`: an integer (an integral number; for the token counts a
  numeric string too);
- `prompt` (completions), `input` (embeddings): a string, an array of strings, an array of token ids or an
  array of arrays of token ids;
- `messages`: an array of objects, `role` a string, `content` a string, null or an array of objects whose
  `text` (when present) is a string;
- `prompt` (tokenize): a string;
- `tokens` (detokenize): an array of token ids of the mock's vocabulary, the Unicode scalar values
  (0 to 0x10FFFF, surrogates excluded: `/tokenize` answers code points).

Integers are at most 64 bits (orjson reads a longer one as a float, which is not integral here).
"""

from __future__ import annotations

from typing import Any

MAX_INT = 2**63 - 1
MAX_CODE_POINT = 0x10FFFF
SURROGATES = range(0xD800, 0xE000)


class RequestError(ValueError):
    """An invalid request (answered 400); `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(value: Any, name: str, *, numeric_string: bool = False) -> int:
    """An integer field: an int, an integral float, or (`numeric_string`) a string of one; 64 bits."""
    number: int | None = None
    if _is_int(value):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif numeric_string and isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            number = None
    if number is None or not -MAX_INT - 1 <= number <= MAX_INT:
        raise RequestError(f"{name} must be an integer, got {value!r}", name)
    return number


def flag(body: dict[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is None or isinstance(value, bool):
        return value
    raise RequestError(f"{name} must be true or false, got {value!r}", name)


def common_fields(body: dict[str, Any]) -> None:
    """The fields every endpoint shares: `model`, `stream`, `stream_options`."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"model must be a string, got {model!r}", "model")
    flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(f"stream_options must be an object, got {options!r}", "stream_options")


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(t) for t in value)


def prompt_texts(value: Any, name: str) -> list[str]:
    """A completions prompt or embeddings input, one text per item (the mock reads token ids as text):
    a string is one text; an array of token ids one text per id, as the mock always read them."""
    if value is None:
        return [""]
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(
        isinstance(item, str) or _is_int(item) or _is_token_ids(item) for item in value
    ):
        kinds = {type(item) for item in value}
        if len(kinds) <= 1:
            return [str(item) for item in value]
    raise RequestError(
        f"{name} must be a string, an array of strings, an array of token ids "
        f"or an array of arrays of token ids, got {_short(value)}",
        name,
    )


def messages(value: Any) -> list[tuple[str, Any]]:
    """The chat messages as (role, content); a missing role is `user`, as the mock always read it."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError("messages must be an array", "messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise RequestError(f"messages[{i}] must be an object, got {_short(message)}", "messages")
        role = message.get("role", "user")
        if not isinstance(role, str):
            raise RequestError(f"messages[{i}].role must be a string, got {_short(role)}", "messages")
        content = message.get("content")
        _check_content(content, i)
        out.append((role, content))
    return out


def _check_content(content: Any, i: int) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise RequestError(
            f"messages[{i}].content must be a string, null or an array, got {_short(content)}", "messages"
        )
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
            raise RequestError(
                f"messages[{i}].content[{j}] must be an object with a string 'text', got {_short(part)}",
                "messages",
            )


def tokenize_prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise RequestError(f"prompt must be a string, got {_short(prompt)}", "prompt")
    return prompt


def detokenize_tokens(body: dict[str, Any]) -> list[int]:
    tokens = body.get("tokens") or []
    if not isinstance(tokens, list):
        raise RequestError(f"tokens must be an array of token ids, got {_short(tokens)}", "tokens")
    for token in tokens:
        if not _is_int(token) or not 0 <= token <= MAX_CODE_POINT or token in SURROGATES:
            raise RequestError(f"token id {_short(token)} is out of vocabulary", "tokens")
    return tokens


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
