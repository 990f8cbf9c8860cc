"""Concurrent mixed traffic for the fault matrix, and the classification of every outcome.

Each request ends as exactly one of:
- `ok`                    a 200 response, or a stream ending with `data: [DONE]`;
- `<reason>`              a contract error before the first byte (`x-gateway-reject-reason`);
- `sse:<code>`            a stream that started and ended with the terminal SSE error event;
- `TRUNCATED` / `CLIENT_TIMEOUT`   a contract violation (silent truncation, or a hang).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import httpx
import orjson

MODEL = "test-model"
VIOLATIONS = {"TRUNCATED", "CLIENT_TIMEOUT", "NO_REASON"}


@dataclass(frozen=True)
class Outcome:
    kind: str
    duration_s: float
    stream: bool


async def _one(
    client: httpx.AsyncClient, i: int, stream: bool, max_tokens: int, headers: dict[str, str]
) -> Outcome:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"request {i}"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    started = time.monotonic()
    try:
        if not stream:
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
            kind = (
                "ok"
                if response.status_code == 200
                else response.headers.get("x-gateway-reject-reason", "NO_REASON")
            )
            return Outcome(kind, time.monotonic() - started, stream)
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                return Outcome(
                    response.headers.get("x-gateway-reject-reason", "NO_REASON"),
                    time.monotonic() - started,
                    stream,
                )
            last = ""
            async for line in response.aiter_lines():
                if line:
                    last = line
            return Outcome(_classify_last(last), time.monotonic() - started, stream)
    except httpx.TimeoutException:
        return Outcome("CLIENT_TIMEOUT", time.monotonic() - started, stream)


def _classify_last(line: str) -> str:
    if line == "data: [DONE]":
        return "ok"
    if line.startswith("data: "):
        try:
            payload = orjson.loads(line[6:])
        except orjson.JSONDecodeError:
            return "TRUNCATED"
        if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
            return f"sse:{payload['error'].get('code')}"
    return "TRUNCATED"


async def run_traffic(
    url: str,
    requests: int,
    *,
    max_tokens: int = 12,
    client_timeout_s: float = 15.0,
    headers: dict[str, str] | None = None,
    spacing_s: float = 0.0,
) -> list[Outcome]:
    """`requests` concurrent requests, alternating streaming and not (optionally spaced out)."""
    limits = httpx.Limits(max_connections=requests + 10)
    async with httpx.AsyncClient(base_url=url, timeout=client_timeout_s, limits=limits) as client:
        tasks = []
        for i in range(requests):
            tasks.append(asyncio.create_task(_one(client, i, i % 2 == 0, max_tokens, headers or {})))
            if spacing_s:
                await asyncio.sleep(spacing_s)
        return list(await asyncio.gather(*tasks))


def tally(outcomes: list[Outcome]) -> Counter[str]:
    return Counter(o.kind for o in outcomes)
