"""The shape limits on the request-body fields the gateway reads, each a 400 naming the field when
broken, never a 500: how deep a body and its prompt-bearing values may nest (the gateway re-serialises
and walks them), and which JSON numbers an integer field takes. Apart from the parsing
(`gateway.api.request_parsing`) because these are the gateway's own bounds, not the API's fields.
"""

from __future__ import annotations

from typing import Any

from gateway.base.errors import BadRequest

MAX_BODY_NESTING = 128
"""Deepest nesting accepted anywhere in a body (tool schemas, unknown fields): the gateway re-serialises
bodies (model rewrite, usage injection, quarantine fingerprints), and orjson writes at most 254 levels.
Deeper is a 400, never a 500."""
MAX_PROMPT_NESTING = 16
"""Deepest nesting of objects and arrays accepted inside a prompt-bearing value (a chat message's
`content`, `prompt`, `input`): real content parts are 3 deep (content → part → image_url). Deeper is a
400 naming the field, before anything walks the value."""


def depth_over(value: object, limit: int) -> bool:
    """True when `value` nests objects/arrays deeper than `limit` (an explicit stack, no recursion)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def check_nesting(body: dict[str, Any]) -> None:
    """Every prompt-bearing field nests at most `MAX_PROMPT_NESTING` deep (400 naming the field)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list | dict) and depth_over(content, MAX_PROMPT_NESTING):
                raise BadRequest(f"'messages[{i}].content' is nested deeper than {MAX_PROMPT_NESTING} levels")
    for name in ("prompt", "input", "query", "documents", "text_1", "text_2", "system"):
        value = body.get(name)
        if isinstance(value, list | dict) and depth_over(value, MAX_PROMPT_NESTING):
            raise BadRequest(f"'{name}' is nested deeper than {MAX_PROMPT_NESTING} levels")


MAX_INTEGER = 2**63 - 1
"""The largest integer field accepted (an engine's signed 64-bit integer)."""


def integral_value(value: object) -> int | None:
    """`value` as an integer when it is a JSON number with an integral value (`4`, `4.0`, `1e2`), else
    None (a boolean, a fraction, a string, anything else)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def optional_int(body: dict[str, Any], *names: str) -> int | None:
    """The first of `names` present and not null, as an integer in [0, `MAX_INTEGER`] (400 otherwise)."""
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        number = integral_value(value)
        if number is None or number < 0:
            raise BadRequest(f"'{name}' must be a non-negative integer")
        if number > MAX_INTEGER:
            raise BadRequest(f"'{name}' must be at most {MAX_INTEGER} (2^63 - 1)")
        return number
    return None
