"""Concurrent streamed traffic on the Responses and Anthropic Messages surfaces for the fault matrix, and
the classification of every outcome in that surface's own format.

Each request ends as exactly one of:
- `ok`              a stream ending as its surface ends one (`response.completed` / `.incomplete`;
                    `message_stop`), or a 200 answer;
- `<reason>`        a contract error before the first byte (`x-gateway-reject-reason`), its body in the
                    surface's shape (OpenAI's with `code` = the reason on Responses, Anthropic's on
                    Messages, whose `error.type` follows the status);
- `sse:<code>`      a stream that started and ended with the surface's terminal `event: error`:
                    Responses `{"type": "error", "code", "message", "param"}` (`<code>` the gateway's
                    reason), Messages `{"type": "error", "error": {"type", "message"}}` (`<code>` the
                    Anthropic type, e.g. `timeout_error`, `api_error`);
- `TRUNCATED` / `CLIENT_TIMEOUT` / `NO_REASON` / `WRONG_SHAPE`   a contract violation.

A Responses request may continue a stored response (`previous_response_id`); each outcome keeps the
id its stream created and the replica that answered, so a later request can chain on it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from tests.faults.traffic import MODEL

RESPONSES = "responses"
MESSAGES = "messages"
PATHS = {RESPONSES: "/v1/responses", MESSAGES: "/v1/messages"}
ENDS = {RESPONSES: ("response.completed", "response.incomplete"), MESSAGES: ("message_stop",)}
ANTHROPIC_TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error"}
ANTHROPIC_TYPES |= {503: "overloaded_error", 504: "timeout_error"}
"""Anthropic's `error.type` by status (its API reference); any other status is `api_error`."""


@dataclass(frozen=True)
class SurfaceOutcome:
    kind: str
    duration_s: float
    stream: bool
    response_id: str | None = None
    replica: str | None = None


def _body(surface: str, i: int, max_tokens: int, previous_id: str | None) -> dict[str, Any]:
    if surface == MESSAGES:
        messages = [{"role": "user", "content": f"request {i}"}]
        return {"model": MODEL, "max_tokens": max_tokens, "messages": messages, "stream": True}
    body: dict[str, Any] = {"model": MODEL, "input": f"request {i}", "max_output_tokens": max_tokens}
    if previous_id is not None:
        body["previous_response_id"] = previous_id
    return {**body, "stream": True}


def events(raw: bytes) -> list[tuple[str, Any]]:
    """The (event type, decoded data) of each SSE event (data `None` when it is no JSON)."""
    out: list[tuple[str, Any]] = []
    for block in raw.split(b"\n\n"):
        kind, data = "", None
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                kind = line[7:].decode()
            elif line.startswith(b"data: "):
                try:
                    data = orjson.loads(line[6:])
                except orjson.JSONDecodeError:
                    data = None
        if kind or data is not None:
            out.append((kind, data))
    return out


def _error_kind(surface: str, data: Any) -> str:
    """`sse:<code>` for a well-formed terminal error event of `surface`, else `WRONG_SHAPE`."""
    if not isinstance(data, dict) or data.get("type") != "error":
        return "WRONG_SHAPE"
    if surface == RESPONSES:
        if set(data) != {"type", "code", "message", "param"} or not isinstance(data["code"], str):
            return "WRONG_SHAPE"
        return f"sse:{data['code']}"
    error = data.get("error")
    if not isinstance(error, dict) or set(error) != {"type", "message"}:
        return "WRONG_SHAPE"
    return f"sse:{error['type']}"


def classify_stream(surface: str, raw: bytes) -> str:
    """The outcome of a stream that started (module docstring)."""
    seen = events(raw)
    if not raw.endswith(b"\n\n") or not seen:
        return "TRUNCATED"
    kind, data = seen[-1]
    if kind in ENDS[surface]:
        return "ok"
    if kind == "error":
        return _error_kind(surface, data)
    return "TRUNCATED"


def classify_refusal(surface: str, response: httpx.Response) -> str:
    """The reason of an error answered before the stream, `WRONG_SHAPE` if its body is not the
    surface's, `NO_REASON` without the header."""
    reason = response.headers.get("x-gateway-reject-reason")
    if reason is None:
        return "NO_REASON"
    body = orjson.loads(response.content)
    if surface == MESSAGES:
        error = body.get("error") if body.get("type") == "error" else None
        kind = ANTHROPIC_TYPES.get(response.status_code, "api_error")
        return reason if isinstance(error, dict) and error.get("type") == kind else "WRONG_SHAPE"
    error = body.get("error")
    return reason if isinstance(error, dict) and error.get("code") == reason else "WRONG_SHAPE"


async def one_stream(
    client: httpx.AsyncClient, surface: str, i: int, max_tokens: int, previous_id: str | None = None
) -> SurfaceOutcome:
    body = _body(surface, i, max_tokens, previous_id)
    started = time.monotonic()
    try:
        async with client.stream("POST", PATHS[surface], json=body) as response:
            raw = await response.aread()
            replica = response.headers.get("x-gateway-replica")
            elapsed = time.monotonic() - started
            if response.status_code != 200:
                return SurfaceOutcome(classify_refusal(surface, response), elapsed, True, replica=replica)
    except httpx.TimeoutException:
        return SurfaceOutcome("CLIENT_TIMEOUT", time.monotonic() - started, True)
    response_id = None
    for kind, data in events(raw):
        if kind == "response.created" and isinstance(data, dict):
            response_id = data["response"]["id"]
    return SurfaceOutcome(classify_stream(surface, raw), elapsed, True, response_id, replica)


async def run_surface_traffic(
    url: str,
    surface: str,
    requests: int,
    *,
    max_tokens: int = 12,
    previous_ids: list[str | None] | None = None,
    headers: dict[str, str] | None = None,
    client_timeout_s: float = 15.0,
) -> list[SurfaceOutcome]:
    """`requests` concurrent streams on `surface` (Responses: request i continues `previous_ids[i]`),
    each with `headers`."""
    limits = httpx.Limits(max_connections=requests + 10)
    previous = previous_ids or [None] * requests
    async with httpx.AsyncClient(
        base_url=url, timeout=client_timeout_s, limits=limits, headers=headers
    ) as client:
        tasks = [one_stream(client, surface, i, max_tokens, previous[i]) for i in range(requests)]
        return list(await asyncio.gather(*tasks))
