"""Mid-stream continuation: the transcript, the continuation request, the splice."""

from __future__ import annotations

import orjson

from gateway.api.request_parsing import Endpoint, parse_request
from gateway.proxy import continuation
from gateway.proxy.continuation import Splice, StreamTranscript, continuation_body


def event(data: object) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def chunk(content: str | None = None, role: str | None = None, **delta: object) -> bytes:
    d: dict[str, object] = dict(delta)
    if role is not None:
        d["role"] = role
    if content is not None:
        d["content"] = content
    return event({"id": "chatcmpl-1", "created": 7, "model": "m", "choices": [{"index": 0, "delta": d}]})


def transcript_of(*events: bytes) -> StreamTranscript:
    transcript = StreamTranscript()
    data = b"".join(events)
    transcript.record(data[:10])  # split anywhere: the transcript reassembles events
    transcript.record(data[10:])
    return transcript


def test_the_transcript_keeps_the_text_the_identity_and_the_chunk_count() -> None:
    t = transcript_of(chunk("", role="assistant"), chunk("Hel"), chunk("lo"), chunk(" world"))
    assert t.text() == "Hello world" and t.content_chunks == 3 and t.resumable
    assert t.identity == {"id": "chatcmpl-1", "created": 7, "model": "m"}


def test_tool_calls_and_several_choices_are_not_resumable() -> None:
    assert not transcript_of(chunk("a"), chunk(tool_calls=[{"index": 0}])).resumable
    two = event({"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {}}]})
    assert not transcript_of(two).resumable


def test_a_long_stream_folds_as_it_goes_and_stops_being_resumable_past_the_cap(monkeypatch) -> None:
    monkeypatch.setattr(continuation, "MAX_TRANSCRIPT_BYTES", 10)
    t = StreamTranscript()
    for _ in range(3):
        t.record(chunk("abcd"))
    assert t.text() == "abcd" * 3 and not t.resumable


def test_a_chat_continuation_appends_the_text_and_spends_the_budget() -> None:
    raw = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True}
    )
    parsed = parse_request(Endpoint.CHAT, raw)
    body = continuation_body(parsed, transcript_of(chunk("a"), chunk("b")), "upstream-m")
    assert body is not None
    sent = orjson.loads(body)
    assert sent["messages"][-1] == {"role": "assistant", "content": "ab"}
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["max_tokens"] == 8 and sent["model"] == "upstream-m"
    assert sent["stream_options"] == {"include_usage": True}
    spent = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert (
        continuation_body(parse_request(Endpoint.CHAT, spent), transcript_of(chunk("a"), chunk("b")), None)
        is None
    )


def test_an_integral_float_budget_is_spent_and_one_choice_as_a_float_is_resumable() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10.0, "n": 1.0}'
    body = continuation_body(parse_request(Endpoint.CHAT, raw), transcript_of(chunk("a"), chunk("b")), None)
    assert body is not None and orjson.loads(body)["max_tokens"] == 8


def test_a_completions_continuation_extends_a_string_prompt_only() -> None:
    text = event({"id": "cmpl-1", "choices": [{"index": 0, "text": "xy"}]})
    raw = orjson.dumps({"model": "m", "prompt": "p:", "stream": True})
    body = continuation_body(parse_request(Endpoint.COMPLETIONS, raw), transcript_of(text), None)
    assert body is not None and orjson.loads(body)["prompt"] == "p:xy"
    listed = orjson.dumps({"model": "m", "prompt": ["p:"], "stream": True})
    assert continuation_body(parse_request(Endpoint.COMPLETIONS, listed), transcript_of(text), None) is None


def test_the_splice_keeps_one_identity_one_role_and_one_usage_total() -> None:
    splice = Splice(transcript_of(chunk("", role="assistant"), chunk("a"), chunk("b")))
    role = event(
        {
            "id": "other",
            "created": 9,
            "model": "m2",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        }
    )
    assert splice.rewrite(role) is None, "no second role chunk"
    out = splice.rewrite(
        event(
            {"id": "other", "created": 9, "model": "m2", "choices": [{"index": 0, "delta": {"content": "c"}}]}
        )
    )
    assert out is not None
    data = orjson.loads(out[6:])
    assert (data["id"], data["created"], data["model"]) == ("chatcmpl-1", 7, "m")
    usage = event(
        {
            "id": "other",
            "choices": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        }
    )
    rewritten = splice.rewrite(usage)
    assert rewritten is not None
    assert orjson.loads(rewritten[6:])["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 7,
        "total_tokens": 17,
    }
    assert splice.rewrite(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
