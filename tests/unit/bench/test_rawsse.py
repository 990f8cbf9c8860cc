"""The bare-asyncio SSE client: content detection, request framing, header parsing, and a full exchange
against a scripted asyncio server (chunked body, usage, reject answers)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from bench.client import ClientOptions
from bench.rawsse import RawSseClient, _headers, _request
from bench.stream_events import StreamFound, on_event
from bench.workload import RequestSpec

SPEC = RequestSpec(messages=(("user", "hi"),), max_tokens=2, session_id="s9")


def _first_content(*payloads: bytes) -> int | None:
    """The index of the payload the shared event reader takes TTFT at (None: no content)."""
    found = StreamFound()
    for i, payload in enumerate(payloads):
        on_event(found, payload, float(i))
    return None if found.ttft_s is None else int(found.ttft_s)


def test_content_detection_skips_role_and_empty_chunks() -> None:
    role = b'{"choices":[{"delta":{"role":"assistant","content":""}}]}'
    usage = b'{"choices":[],"usage":{"completion_tokens":3}}'
    assert _first_content(role, usage, b'{"choices":[{"delta":{"content":" hi"}}]}') == 2
    assert _first_content(role, b'{"choices":[{"text":"x","finish_reason":null}]}') == 1
    assert _first_content(role, usage) is None


def test_request_framing() -> None:
    options = ClientOptions(model="m", api_key="k", extra_headers={"x-extra": "1"})
    host, port, raw = _request("http://127.0.0.1:8123", RequestSpec(prompt="p", max_tokens=2), options)
    assert (host, port) == ("127.0.0.1", 8123)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:8123")
    assert f"content-length: {len(body)}".encode() in head
    assert b"authorization: Bearer k" in head and b"x-extra: 1" in head
    assert b'"stream":true' in body and b'"include_usage":true' in body


def test_header_parsing() -> None:
    status, headers = _headers(
        b"HTTP/1.1 429 Too Many\r\nRetry-After: 4\r\nX-Gateway-Reject-Reason: queue_full\r\n\r\n"
    )
    assert (
        status == 429 and headers["retry-after"] == "4" and headers["x-gateway-reject-reason"] == "queue_full"
    )


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def serve(answer: list[bytes | float]) -> tuple[asyncio.Server, str, list[bytes]]:
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        for part in answer:
            if isinstance(part, float):
                await asyncio.sleep(part)
            else:
                writer.write(part)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", requests


@pytest.fixture
async def closer() -> AsyncIterator[list[asyncio.Server]]:
    servers: list[asyncio.Server] = []
    yield servers
    for server in servers:
        server.close()


async def test_chunked_stream_with_usage(closer: list[asyncio.Server]) -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-gateway-replica: r:1\r\n\r\n"
    role = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    token = b'data: {"choices":[{"delta":{"content":" a"}}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
    parts: list[bytes | float] = [head, chunk(role), 0.03, chunk(token), chunk(token[:20]), chunk(token[20:])]
    server, url, seen = await serve([*parts, chunk(usage + b"data: [DONE]\n\n"), b"0\r\n\r\n"])
    closer.append(server)
    sample = await RawSseClient(ClientOptions(model="m")).send(url, SPEC, 0, 0.0, time.perf_counter())
    assert sample.ok and sample.status == 200 and sample.replica == "r:1"
    assert sample.ttft_s is not None and sample.ttft_s >= 0.03
    assert sample.output_tokens == 2 and sample.frames == 4
    assert b"x-session-id: s9" in seen[0]


async def test_reject_and_truncation(closer: list[asyncio.Server]) -> None:
    reject = b"HTTP/1.1 503 Unavailable\r\nretry-after: 2\r\nx-gateway-reject-reason: no_replica\r\n\r\n"
    server, url, _ = await serve([reject])
    closer.append(server)
    sample = await RawSseClient(ClientOptions(model="m")).send(url, SPEC, 0, 0.0, time.perf_counter())
    assert (sample.status, sample.reject_reason, sample.retry_after_s, sample.rejected) == (
        503,
        "no_replica",
        2.0,
        True,
    )
    cut = b"HTTP/1.1 200 OK\r\n\r\n" + b'data: {"choices":[{"delta":{"content":" a"}}]}\n\n'
    server, url, _ = await serve([cut])
    closer.append(server)
    sample = await RawSseClient(ClientOptions(model="m")).send(url, SPEC, 0, 0.0, time.perf_counter())
    assert not sample.ok and sample.error == "truncated" and sample.output_tokens == 1


STREAM_ANSWER = (
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    + chunk(b'data: {"choices":[{"delta":{"content":" a"}}]}\n\n')
    + chunk(b"data: [DONE]\n\n")
    + b"0\r\n\r\n"
)
REFUSAL_BODY = b'{"error":{"code":"queue_full"}}'
REFUSAL_ANSWER = (
    b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\nx-gateway-reject-reason: queue_full\r\n"
    + f"content-length: {len(REFUSAL_BODY)}\r\n\r\n".encode()
    + REFUSAL_BODY
)


async def serve_keep_alive(
    answers: list[bytes], close_after: int | None = None
) -> tuple[asyncio.Server, str, list[int]]:
    """Answers requests in order on whatever connection they come; `connections[i]` is the number of
    requests connection i answered. `close_after`: after that many answers a connection reads the next
    request and closes without answering (the server's keep-alive timeout racing a reuse)."""
    connections: list[int] = []
    queue = list(answers)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(0)
        me = len(connections) - 1
        try:
            while queue:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                connections[me] += 1
                writer.write(queue.pop(0))
                await writer.drain()
                if close_after is not None and connections[me] >= close_after:
                    await reader.readuntil(b"\r\n\r\n")
                    break
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections


async def test_keep_alive_reuses_one_connection_after_streams_and_refusals(
    closer: list[asyncio.Server],
) -> None:
    server, url, connections = await serve_keep_alive([STREAM_ANSWER, REFUSAL_ANSWER, STREAM_ANSWER])
    closer.append(server)
    client = RawSseClient(ClientOptions(model="m", keep_alive=True))
    first = await client.send(url, SPEC, 0, 0.0, time.perf_counter())
    refused = await client.send(url, SPEC, 1, 0.0, time.perf_counter())
    last = await client.send(url, SPEC, 2, 0.0, time.perf_counter())
    await client.aclose()
    assert first.ok and last.ok and last.output_tokens == 1
    assert (refused.status, refused.reject_reason) == (429, "queue_full")
    assert connections == [3], "the stream's last chunk and the refusal's body were read: one connection"


async def test_keep_alive_retries_once_when_the_server_closed_the_idle_connection(
    closer: list[asyncio.Server],
) -> None:
    server, url, connections = await serve_keep_alive([STREAM_ANSWER, STREAM_ANSWER], close_after=1)
    closer.append(server)
    client = RawSseClient(ClientOptions(model="m", keep_alive=True))
    assert (await client.send(url, SPEC, 0, 0.0, time.perf_counter())).ok
    second = await client.send(url, SPEC, 1, 0.0, time.perf_counter())
    await client.aclose()
    assert second.ok and second.error is None
    assert connections == [1, 1]


async def test_without_keep_alive_or_when_the_server_says_close_each_request_connects(
    closer: list[asyncio.Server],
) -> None:
    server, url, connections = await serve_keep_alive([STREAM_ANSWER, STREAM_ANSWER])
    closer.append(server)
    client = RawSseClient(ClientOptions(model="m"))
    for index in range(2):
        assert (await client.send(url, SPEC, index, 0.0, time.perf_counter())).ok
    assert connections == [1, 1]
    closing = REFUSAL_ANSWER.replace(b"retry-after: 1\r\n", b"retry-after: 1\r\nconnection: close\r\n")
    server, url, connections = await serve_keep_alive([closing, closing])
    closer.append(server)
    client = RawSseClient(ClientOptions(model="m", keep_alive=True))
    for index in range(2):
        assert (await client.send(url, SPEC, index, 0.0, time.perf_counter())).status == 429
    await client.aclose()
    assert connections == [1, 1], "connection: close is honoured"


async def test_keep_alive_does_not_resend_after_part_of_an_answer_arrived(
    closer: list[asyncio.Server],
) -> None:
    accepted: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        for answer in (STREAM_ANSWER, b"HTTP/1.1 2"):
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    closer.append(server)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = RawSseClient(ClientOptions(model="m", keep_alive=True))
    assert (await client.send(url, SPEC, 0, 0.0, time.perf_counter())).ok
    broken = await client.send(url, SPEC, 1, 0.0, time.perf_counter())
    await client.aclose()
    assert (broken.status, broken.error) == (0, "IncompleteReadError")
    assert accepted == [1], "the request was not sent again on a new connection"
