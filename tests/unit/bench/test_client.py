"""The benchmark client against scripted HTTP answers (httpx.MockTransport): TTFT at the first content
token, usage, rejections with their reason and Retry-After, truncated and failed streams."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from bench.client import BenchClient, ClientOptions
from bench.workload import RequestSpec

SPEC = RequestSpec(messages=(("user", "hi"),), max_tokens=3, session_id="s1", priority="batch")


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat_chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {"role": "assistant", "content": ""} if content is None else {"content": content}
    return event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


USAGE = event({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}})
DONE = b"data: [DONE]\n\n"


def paced(parts: list[bytes | float]) -> Callable[[], AsyncIterator[bytes]]:
    async def body() -> AsyncIterator[bytes]:
        for part in parts:
            if isinstance(part, float):
                await asyncio.sleep(part)
            else:
                yield part

    return body


def client_for(handler: Callable[[httpx.Request], httpx.Response], **options: object) -> BenchClient:
    return BenchClient(ClientOptions(model="m", **options), transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


async def send(client: BenchClient, spec: RequestSpec = SPEC):  # type: ignore[no-untyped-def]
    try:
        return await client.send("http://gw", spec, 0, 0.0, time.perf_counter())
    finally:
        await client.aclose()


async def test_stream_ttft_is_the_first_content_not_the_role_chunk() -> None:
    seen: list[httpx.Request] = []
    parts: list[bytes | float] = [chat_chunk(None), 0.05, chat_chunk(" a"), 0.01, chat_chunk(" b")]
    parts += [chat_chunk(" c"), chat_chunk("", "length"), USAGE, DONE]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        headers = {"x-gateway-replica": "r1:80", "x-gateway-route": "policy=p; branch=b; hops=0"}
        return httpx.Response(200, headers=headers, content=paced(parts)())

    sample = await send(client_for(handler))
    assert sample.ok and sample.status == 200 and sample.error is None
    assert sample.ttft_s is not None and sample.ttft_s >= 0.05
    assert sample.e2e_s >= sample.ttft_s
    assert sample.output_tokens == 3 and sample.prompt_tokens == 1
    assert sample.tpot_s == pytest.approx((sample.e2e_s - sample.ttft_s) / 2)
    assert sample.frames == 6  # role, 3 content, finish, usage
    assert sample.max_gap_s is not None and sample.max_gap_s >= 0.009
    assert (sample.replica, sample.route) == ("r1:80", "policy=p; branch=b; hops=0")
    body = json.loads(seen[0].content)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert seen[0].headers["x-session-id"] == "s1" and seen[0].headers["x-gateway-priority"] == "batch"
    assert seen[0].url.path == "/v1/chat/completions"


async def test_stream_without_usage_counts_content_frames() -> None:
    parts: list[bytes | float] = [
        chat_chunk(None),
        chat_chunk(" a"),
        chat_chunk(" b"),
        chat_chunk("", "stop"),
        DONE,
    ]
    sample = await send(client_for(lambda r: httpx.Response(200, content=paced(parts)())))
    assert sample.ok and sample.output_tokens == 2


async def test_completions_text_counts_as_content() -> None:
    parts: list[bytes | float] = [event({"choices": [{"text": " x", "finish_reason": None}]}), USAGE, DONE]
    spec = RequestSpec(prompt="p", max_tokens=1)
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, content=paced(parts)())

    sample = await send(client_for(handler), spec)
    assert sample.ok and sample.ttft_s is not None and seen == ["/v1/completions"]


async def test_truncated_stream_and_terminal_error_event_are_failures() -> None:
    truncated: list[bytes | float] = [chat_chunk(None), chat_chunk(" a")]
    sample = await send(client_for(lambda r: httpx.Response(200, content=paced(truncated)())))
    assert not sample.ok and sample.error == "truncated" and sample.outcome == "truncated"
    failed: list[bytes | float] = [
        chat_chunk(" a"),
        event({"error": {"code": "upstream_idle_timeout"}}),
        DONE,
    ]
    sample = await send(client_for(lambda r: httpx.Response(200, content=paced(failed)())))
    assert not sample.ok and sample.error == "upstream_idle_timeout"


async def test_rejection_records_reason_retry_after_and_latency() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"x-gateway-reject-reason": "queue_full", "retry-after": "3"}
        return httpx.Response(429, headers=headers, json={"error": {"code": "queue_full"}})

    sample = await send(client_for(handler))
    assert not sample.ok and sample.rejected and sample.status == 429
    assert (sample.reject_reason, sample.retry_after_s, sample.outcome) == ("queue_full", 3.0, "queue_full")
    assert sample.e2e_s > 0 and sample.ttft_s is None


async def test_honours_retry_after_when_asked() -> None:
    answers = [httpx.Response(503, headers={"retry-after": "0", "x-gateway-reject-reason": "no_replica"})]
    answers.append(httpx.Response(200, json={"choices": [], "usage": {"completion_tokens": 3}}))
    sample = await send(client_for(lambda r: answers.pop(0), stream=False, retry_after_retries=2))
    assert sample.ok and sample.attempts == 2 and sample.output_tokens == 3
    assert sample.ttft_s == sample.e2e_s  # non-streamed: the whole answer


async def test_transport_failure_is_status_zero() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    sample = await send(client_for(handler))
    assert (sample.status, sample.ok, sample.error, sample.outcome) == (
        0,
        False,
        "ConnectError",
        "ConnectError",
    )
