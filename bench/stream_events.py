"""What one streamed answer's SSE `data:` payloads tell the load generator, for both of its clients.

`BenchClient` (httpx) and `RawSseClient` (bare asyncio) split a body into events their own way, then
hand each `data:` payload to `on_event`. TTFT is the arrival of the first payload with content as
`core.first_token` defines it (the definition the gateway measures with: text, content, reasoning,
tool-call and function-call deltas count; a role chunk or a usage-only chunk does not). Only payloads
that can matter are parsed: every one until the first content, then only usage and error payloads; the
rest are counted and timed, so the clients stay cheap at thousands of frames per second.

Output tokens come from the usage event when the body asked for it (`stream_options.include_usage`);
without it, the frames from the first content on are counted, less a final frame without content (the
finish chunk), which assumes one token per frame.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import orjson

from bench.sample import Sample
from bench.stats import tpot_s
from core.first_token import chunk_has_content


@dataclass(slots=True)
class StreamFound:
    """What reading one SSE stream found."""

    ttft_s: float | None = None
    frames: int = 0
    content_frames: int = 0
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    done: bool = False
    error: str | None = None
    max_gap_s: float = 0.0
    last_data: bytes = b""


def on_event(found: StreamFound, data: bytes, at_s: float) -> None:
    """Record one `data:` payload (stripped) that arrived `at_s` after the request was sent.

    Raises `ValueError` (orjson's decode error) for a payload before the first content that is not JSON.
    """
    if data == b"[DONE]":
        found.done = True
        return
    found.frames += 1
    found.last_data = data
    if found.ttft_s is not None and b'"usage"' not in data and b'"error"' not in data[:16]:
        found.content_frames += 1
        return
    event = orjson.loads(data)
    if not isinstance(event, dict):
        return
    if "error" in event:
        error = event["error"]
        found.error = (
            str(error.get("code") or error.get("type") or "error") if isinstance(error, dict) else "error"
        )
        return
    usage = event.get("usage")
    if isinstance(usage, dict) and usage:
        found.usage_tokens = int(usage.get("completion_tokens") or 0)
        found.prompt_tokens = usage.get("prompt_tokens")
    if chunk_has_content(event):
        found.content_frames += 1
        if found.ttft_s is None:
            found.ttft_s = at_s


def counted_tokens(found: StreamFound) -> int:
    """Without usage: the frames from the first content on, less a final frame without content (the
    finish chunk) — one parse per stream."""
    frames = found.content_frames
    if frames and found.last_data:
        with contextlib.suppress(ValueError):
            if not chunk_has_content(orjson.loads(found.last_data)):
                frames -= 1
    return frames


def stream_sample(base: dict[str, Any], meta: dict[str, Any], found: StreamFound, e2e_s: float) -> Sample:
    """The sample of a 200 streamed answer: `base` from `sample_base`, `meta` from the response headers."""
    tokens = found.usage_tokens if found.usage_tokens is not None else counted_tokens(found)
    ttft = found.ttft_s
    return Sample(
        **base,
        status=200,
        ok=found.done and found.error is None,
        e2e_s=e2e_s,
        ttft_s=ttft,
        tpot_s=tpot_s(e2e_s, ttft, tokens) if ttft is not None else None,
        output_tokens=tokens,
        prompt_tokens=found.prompt_tokens,
        frames=found.frames,
        max_gap_s=found.max_gap_s,
        error=found.error or (None if found.done else "truncated"),
        **meta,
    )
