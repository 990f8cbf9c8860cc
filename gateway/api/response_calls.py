"""The `/v1/responses/{id}` paths of the Responses API: retrieve (`GET`), delete (`DELETE`) and cancel
(`POST /v1/responses/{id}/cancel`). They carry no body naming a model: the gateway finds the pool and
replica from the id (`gateway.proxy.response_affinity`)."""

from __future__ import annotations

from dataclasses import dataclass

RESPONSES_PREFIX = "/v1/responses/"


@dataclass(frozen=True, slots=True)
class ResponseCall:
    """One `/v1/responses/{id}[/cancel]` path: the id, and the methods the path answers."""

    response_id: str
    allow: tuple[str, ...]


def response_call(path: str) -> ResponseCall | None:
    """The call a path names, or None when it is no `/v1/responses/{id}[/cancel]` path."""
    if not path.startswith(RESPONSES_PREFIX):
        return None
    parts = path[len(RESPONSES_PREFIX) :].split("/")
    if len(parts) == 1 and parts[0]:
        return ResponseCall(parts[0], ("GET", "DELETE"))
    if len(parts) == 2 and parts[0] and parts[1] == "cancel":
        return ResponseCall(parts[0], ("POST",))
    return None
