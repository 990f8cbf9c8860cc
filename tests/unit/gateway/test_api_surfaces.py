"""Units of the Anthropic / Responses / pooling surfaces: parsing, the error shapes, the named-event
inspection (first output, usage, end, response id) and the response-state map."""

from __future__ import annotations

import orjson
import pytest

from core.clock import FakeClock
from core.first_token import anthropic_event_has_content, responses_event_has_content
from gateway.api.request_parsing import Endpoint, parse_request, rewrite_body
from gateway.api.response_calls import response_call
from gateway.base.error_mapping import to_response, to_sse_event
from gateway.base.errors import BadRequest, NoReplica, UpstreamIdleTimeout
from gateway.base.surface import ApiSurface
from gateway.proxy.sse import inspect_named_event, merged_usage, normalized_usage
from gateway.proxy.stores.response_state import MemoryResponseState, ResponseLocation


def _event(name: str, **data: object) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n"


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}}, True),
        ({"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "hm"}}, True),
        ({"type": "content_block_delta", "delta": {"type": "input_json_delta", "partial_json": "{"}}, True),
        ({"type": "content_block_delta", "delta": {"type": "input_json_delta", "partial_json": ""}}, False),
        ({"type": "content_block_start", "content_block": {"type": "text", "text": "x"}}, False),
        ({"type": "message_start", "message": {}}, False),
        ({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}, False),
    ],
)
def test_anthropic_content(event: dict[str, object], expected: bool) -> None:
    assert anthropic_event_has_content(event) is expected


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"type": "response.output_text.delta", "delta": "hi"}, True),
        ({"type": "response.reasoning_text.delta", "delta": "hm"}, True),
        ({"type": "response.function_call_arguments.delta", "delta": "{"}, True),
        ({"type": "response.output_text.delta", "delta": ""}, False),
        ({"type": "response.created", "response": {}}, False),
        ({"type": "response.output_text.done", "text": "hi"}, False),
    ],
)
def test_responses_content(event: dict[str, object], expected: bool) -> None:
    assert responses_event_has_content(event) is expected


def test_anthropic_stream_usage_comes_in_parts_and_message_stop_ends_it() -> None:
    start = _event("message_start", message={"usage": {"input_tokens": 7, "output_tokens": 1}})
    delta = _event("message_delta", delta={}, usage={"output_tokens": 5})
    first = inspect_named_event(start, True, ApiSurface.ANTHROPIC)
    second = inspect_named_event(delta, False, ApiSurface.ANTHROPIC)
    assert first.usage is not None and second.usage is not None
    assert merged_usage(first.usage, second.usage) == {
        "prompt_tokens": 7,
        "completion_tokens": 5,
        "total_tokens": 12,
    }
    assert inspect_named_event(_event("message_stop"), False, ApiSurface.ANTHROPIC).is_done
    assert inspect_named_event(_event("error", error={"type": "x"}), False, ApiSurface.ANTHROPIC).error


def test_responses_stream_id_usage_and_terminal_events() -> None:
    created = inspect_named_event(
        _event("response.created", response={"id": "resp_1"}), True, ApiSurface.RESPONSES
    )
    assert created.response_id == "resp_1" and not created.has_content
    usage = {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
    for terminal in ("response.completed", "response.incomplete", "response.failed"):
        info = inspect_named_event(_event(terminal, response={"usage": usage}), False, ApiSurface.RESPONSES)
        assert info.is_done and info.usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert normalized_usage({"prompt_tokens": 1}) == {"prompt_tokens": 1}, "OpenAI usage as is"


def test_anthropic_error_rendering_keeps_status_and_headers() -> None:
    error = NoReplica("nothing up", retry_after_s=2.5)
    openai_answer, anthropic_answer = to_response(error), to_response(error, ApiSurface.ANTHROPIC)
    assert anthropic_answer.status == openai_answer.status == 503
    assert anthropic_answer.headers == openai_answer.headers
    assert orjson.loads(anthropic_answer.body) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "nothing up"},
    }
    assert to_sse_event(UpstreamIdleTimeout("quiet"), ApiSurface.ANTHROPIC).startswith(
        b"event: error\ndata: "
    )
    responses_event = to_sse_event(UpstreamIdleTimeout("quiet"), ApiSurface.RESPONSES)
    data = orjson.loads(responses_event.split(b"data: ", 1)[1])
    assert data == {"type": "error", "code": "upstream_idle_timeout", "message": "quiet", "param": None}


def test_parsing_the_new_bodies() -> None:
    messages = parse_request(
        Endpoint.MESSAGES,
        orjson.dumps(
            {
                "model": "m",
                "system": "be brief",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "max_tokens": 9,
            }
        ),
    )
    assert messages.max_tokens == 9 and "be brief" in messages.prompt_text and "hi" in messages.prompt_text
    assert rewrite_body(messages, None) == messages.raw, "no stream_options added outside chat/completions"
    responses = parse_request(
        Endpoint.RESPONSES,
        orjson.dumps({"model": "m", "input": "hi", "max_output_tokens": 4, "previous_response_id": "resp_1"}),
    )
    assert responses.max_tokens == 4 and responses.previous_response_id == "resp_1"
    rerank = parse_request(
        Endpoint.RERANK, orjson.dumps({"model": "m", "query": "q", "documents": ["d1", "d2"]})
    )
    assert all(text in rerank.prompt_text for text in ("q", "d1", "d2"))
    with pytest.raises(BadRequest, match="'documents' is required"):
        parse_request(Endpoint.RERANK, orjson.dumps({"model": "m", "query": "q"}))
    with pytest.raises(BadRequest, match="streaming is not supported"):
        parse_request(Endpoint.SCORE, orjson.dumps({"model": "m", "stream": True}))
    assert [e.capability for e in (Endpoint.RERANK_UNVERSIONED, Endpoint.COUNT_TOKENS, Endpoint.CHAT)] == [
        "rerank",
        "messages",
        "chat",
    ]


def test_response_call_paths() -> None:
    assert response_call("/v1/responses/resp_1") is not None
    assert response_call("/v1/responses/resp_1/cancel").allow == ("POST",)  # type: ignore[union-attr]
    assert response_call("/v1/responses/resp_1").allow == ("GET", "DELETE")  # type: ignore[union-attr]
    for path in ("/v1/responses", "/v1/responses/", "/v1/responses/a/b", "/v1/responses/a/cancel/x"):
        assert response_call(path) is None, path


async def test_the_memory_map_expires_and_is_bounded() -> None:
    clock = FakeClock()
    state = MemoryResponseState(clock, ttl_s=10, max_entries=2)
    here = ResponseLocation("m", "r1")
    await state.put("a", here)
    clock.advance(9.9)
    assert await state.get("a") == here
    clock.advance(0.1)
    assert await state.get("a") is None, "expired ttl_s after its write"
    for name in ("b", "c", "d"):
        await state.put(name, here)
    assert len(state) == 2 and await state.get("b") is None, "the oldest dropped first"


async def test_the_memory_map_forgets_a_deleted_id() -> None:
    state = MemoryResponseState(FakeClock())
    here = ResponseLocation("m", "r1")
    await state.put("a", here)
    await state.put("b", here)
    await state.delete("a")
    await state.delete("never")  # an unknown id: nothing to do
    assert await state.get("a") is None and await state.get("b") == here and len(state) == 1
