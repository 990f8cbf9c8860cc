"""What the Kubernetes API server answers, as EndpointSlice discovery
(`gateway.upstream.discovery.kubernetes`) reads it: the errors — an unexpected status (`ApiError`), 410
Gone on a resourceVersion too old to resume from (`ResourceExpired`: re-list), a body that is not the
JSON the API defines (`MalformedResponse`) — and the JSON object of an answer, with a message even when
the body is not JSON. Apart from the list-and-watch loop because this is the wire, not the protocol.
"""

from __future__ import annotations

import json
from typing import Any

import httpx


class ApiError(Exception):
    """An unexpected answer from the API server."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class ResourceExpired(ApiError):
    """410 Gone: the resourceVersion is too old to resume from; re-list."""


class MalformedResponse(ApiError):
    """A body that is not the JSON the API defines."""


def status_message(body: Any) -> str:
    """The message of an API server's Status body (else the body itself)."""
    if isinstance(body, dict):
        return str(body.get("message") or body.get("reason") or body)
    return str(body)


def json_body(response: httpx.Response, content: bytes | None = None) -> dict[str, Any]:
    """The answer's JSON object (of `content` when given); a body that is not one becomes
    `{"message": <its start>}`, so an error answer always has a message."""
    raw = response.content if content is None else content
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = {"message": raw[:200].decode("utf-8", "replace")}
    return body if isinstance(body, dict) else {"message": str(body)[:200]}
