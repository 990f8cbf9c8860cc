"""One definition of "this chunk has content" (core.first_token): the gateway's TTFT (sse.inspect_event)
and the load generator's (bench.stream_events.on_event, used by both bench clients) start at the same
chunk, on a table of the chunks engines send."""

from __future__ import annotations

import orjson
import pytest

from bench.stream_events import StreamFound, counted_tokens, on_event
from core.first_token import DELTA_CONTENT_FIELDS, chunk_has_content
from gateway.proxy.sse import inspect_event


def _chat(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _text(text: str, finish: str | None = None) -> dict[str, object]:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


TOOL_CALL = [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]

CHUNKS: list[tuple[str, dict[str, object], bool]] = [
    ("chat content", _chat({"content": " hi"}), True),
    ("reasoning_content only", _chat({"reasoning_content": "Let me think"}), True),
    ("reasoning only (vLLM's newer field)", _chat({"reasoning": "Let me think"}), True),
    ("tool-call delta", _chat({"tool_calls": TOOL_CALL}), True),
    ("legacy function_call delta", _chat({"function_call": {"name": "f", "arguments": ""}}), True),
    ("completions text", _text("x"), True),
    ("second choice has content", {"choices": [{"index": 0, "delta": {}}, {"index": 1, "text": "y"}]}, True),
    ("empty role chunk", _chat({"role": "assistant", "content": ""}), False),
    ("role chunk, null content", _chat({"role": "assistant", "content": None}), False),
    ("empty reasoning and tool calls", _chat({"reasoning_content": "", "tool_calls": []}), False),
    ("finish chunk", _chat({}, finish="stop"), False),
    ("empty completions text", _text("", finish="length"), False),
    ("usage-only chunk", {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, False),
    ("no choices", {"id": "x"}, False),
]


@pytest.mark.parametrize(("chunk", "expected"), [(c, e) for _, c, e in CHUNKS], ids=[n for n, _, _ in CHUNKS])
def test_gateway_and_bench_agree_on_what_has_content(chunk: dict[str, object], expected: bool) -> None:
    payload = orjson.dumps(chunk)
    assert chunk_has_content(chunk) is expected
    assert inspect_event(b"data: " + payload + b"\n\n", need_content=True).has_content is expected
    found = StreamFound()
    on_event(found, payload, at_s=1.0)
    assert (found.ttft_s is not None) is expected
    assert found.content_frames == int(expected)


def test_a_stream_starts_its_ttft_at_the_same_chunk_for_both() -> None:
    stream = [
        _chat({"role": "assistant", "content": ""}),
        _chat({"reasoning_content": "hmm"}),
        _chat({"content": "Hi"}),
        _chat({}, finish="stop"),
    ]
    gateway_first = next(
        i
        for i, c in enumerate(stream)
        if inspect_event(b"data: " + orjson.dumps(c) + b"\n\n", True).has_content
    )
    found = StreamFound()
    for i, chunk in enumerate(stream):
        on_event(found, orjson.dumps(chunk), at_s=float(i))
    on_event(found, b"[DONE]", at_s=9.0)
    assert found.ttft_s == gateway_first == 1
    assert counted_tokens(found) == 2  # reasoning and content; the finish chunk is not a token


def test_the_documented_fields_are_the_ones_that_count() -> None:
    for name in DELTA_CONTENT_FIELDS:
        assert chunk_has_content(_chat({name: "x"}))
    assert not chunk_has_content(_chat({"role": "assistant", "logprobs": {"content": []}}))
    assert not chunk_has_content(["not", "a", "chunk"])
