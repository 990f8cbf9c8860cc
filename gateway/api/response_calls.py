"""The `/v1/responses/{id}` paths of the Responses API: retrieve (`GET`), delete (`DELETE`), cancel
(`POST /v1/responses/{id}/cancel`) and the input items (`GET /v1/responses/{id}/input_items`). They
carry no body naming a model: the gateway finds the pool and replica from the id
(`gateway.proxy.response_affinity`)."""

from __future__ import annotations

from dataclasses import dataclass

RESPONSES_PREFIX = "/v1/responses/"
_SUB_CALLS = {"cancel": ("POST",), "input_items": ("GET",)}
"""`/v1/responses/{id}/<name>` calls and the methods each answers."""


@dataclass(frozen=True, slots=True)
class ResponseCall:
    """One `/v1/responses/{id}[/cancel|/input_items]` path: the id, and the methods the path answers."""

    response_id: str
    allow: tuple[str, ...]


def response_call(path: str) -> ResponseCall | None:
    """The call a path names, or None when it is no `/v1/responses/{id}[/cancel|/input_items]` path."""
    if not path.startswith(RESPONSES_PREFIX):
        return None
    parts = path[len(RESPONSES_PREFIX) :].split("/")
    if len(parts) == 1 and parts[0]:
        return ResponseCall(parts[0], ("GET", "DELETE"))
    if len(parts) == 2 and parts[0] and parts[1] in _SUB_CALLS:
        return ResponseCall(parts[0], _SUB_CALLS[parts[1]])
    return None
