from __future__ import annotations

import orjson
import pytest

from gateway.api.request_parsing import Endpoint, parse_request, rewrite_body
from gateway.base.errors import BadRequest


def _chat(**extra: object) -> bytes:
    return orjson.dumps(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": [{"type": "text", "text": "U"}]},
            ],
            **extra,
        }
    )


def test_chat_fields_and_prompt_text() -> None:
    parsed = parse_request(Endpoint.CHAT, _chat(max_tokens=7, user="alice"))
    assert parsed.model == "m" and parsed.max_tokens == 7 and not parsed.stream
    assert parsed.prompt_text == "<|system|>\nS\n<|user|>\nU\n"
    assert parsed.user == "alice"
    assert parsed.estimated_prompt_tokens == 6  # ceil(24 / 4)


def test_max_completion_tokens_wins() -> None:
    assert parse_request(Endpoint.CHAT, _chat(max_tokens=7, max_completion_tokens=3)).max_tokens == 3


def test_body_is_forwarded_unchanged_when_no_rewrite_is_needed() -> None:
    raw = _chat(stream=True, stream_options={"include_usage": True})
    parsed = parse_request(Endpoint.CHAT, raw)
    assert rewrite_body(parsed, None) is raw


def test_stream_without_usage_asks_the_engine_for_it() -> None:
    parsed = parse_request(
        Endpoint.CHAT, _chat(stream=True, stream_options={"continuous_usage_stats": False})
    )
    body = orjson.loads(rewrite_body(parsed, "org/model"))
    assert body["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert body["model"] == "org/model"
    assert not parsed.client_wants_usage


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        (Endpoint.COMPLETIONS, b'{"model": "m"}'),
        (Endpoint.EMBEDDINGS, b'{"model": "m"}'),
        (Endpoint.EMBEDDINGS, b'{"model": "m", "input": "x", "stream": true}'),
        (Endpoint.CHAT, b'{"model": "m", "messages": [{"content": "no role"}]}'),
        (Endpoint.CHAT, b'{"model": "m", "messages": [{"role": "user"}], "stream_options": 1}'),
        (Endpoint.CHAT, b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": true}'),
    ],
)
def test_invalid_bodies(endpoint: Endpoint, body: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_request(endpoint, body)


def test_completion_prompt_list() -> None:
    parsed = parse_request(Endpoint.COMPLETIONS, b'{"model": "m", "prompt": ["ab", "cd"]}')
    assert parsed.prompt_text == "ab\ncd"


def test_stream_null_is_not_streamed() -> None:
    parsed = parse_request(Endpoint.CHAT, _chat(stream=None))
    assert parsed.stream is False
    with pytest.raises(BadRequest, match="'stream' must be a boolean"):
        parse_request(Endpoint.CHAT, _chat(stream="yes"))


def _nested(depth: int) -> str:
    """JSON text of a string inside `depth` arrays (orjson.dumps itself refuses such depth)."""
    return "[" * depth + '"deep"' + "]" * depth


@pytest.mark.parametrize(
    ("endpoint", "field", "template"),
    [
        (
            Endpoint.CHAT,
            "messages[1].content",
            '"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": %s}]',
        ),
        (Endpoint.COMPLETIONS, "prompt", '"prompt": %s'),
        (Endpoint.EMBEDDINGS, "input", '"input": %s'),
    ],
)
def test_deeply_nested_prompts_are_a_bad_request_naming_the_field(endpoint, field, template) -> None:
    """1,000 levels parse as JSON; nothing after the edge may walk them recursively (it was a 500)."""
    raw = ('{"model": "m", ' + template % _nested(1000) + "}").encode()
    with pytest.raises(BadRequest) as refused:
        parse_request(endpoint, raw)
    assert refused.value.message == f"'{field}' is nested deeper than 16 levels"
    parse_request(endpoint, ('{"model": "m", ' + template % _nested(3) + "}").encode())  # content parts: fine


_INTEGER_FIELDS = [
    (Endpoint.CHAT, "max_tokens"),
    (Endpoint.CHAT, "max_completion_tokens"),
    (Endpoint.CHAT, "n"),
    (Endpoint.COMPLETIONS, "max_tokens"),
    (Endpoint.COMPLETIONS, "n"),
    (Endpoint.MESSAGES, "max_tokens"),
    (Endpoint.RESPONSES, "max_output_tokens"),
]
_BODIES = {
    Endpoint.CHAT: '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "%s": %s}',
    Endpoint.COMPLETIONS: '{"model": "m", "prompt": "hi", "%s": %s}',
    Endpoint.MESSAGES: '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "%s": %s}',
    Endpoint.RESPONSES: '{"model": "m", "input": "hi", "%s": %s}',
}


def _integer_body(endpoint: Endpoint, field: str, literal: str) -> bytes:
    return (_BODIES[endpoint] % (field, literal)).encode()


@pytest.mark.parametrize(("endpoint", "field"), _INTEGER_FIELDS)
@pytest.mark.parametrize(("literal", "value"), [("4.0", 4), ("1e2", 100), ("9223372036854775807", 2**63 - 1)])
def test_an_integral_json_number_is_an_integer_and_the_body_goes_unchanged(
    endpoint: Endpoint, field: str, literal: str, value: int
) -> None:
    raw = _integer_body(endpoint, field, literal)
    parsed = parse_request(endpoint, raw)
    assert (parsed.n if field == "n" else parsed.max_tokens) == value
    assert rewrite_body(parsed, None) is raw, "forwarded byte for byte"


@pytest.mark.parametrize(("endpoint", "field"), _INTEGER_FIELDS)
@pytest.mark.parametrize("literal", ["9223372036854775808", "1e19", "18446744073709551616"])
def test_an_integer_past_2_63_is_a_clear_bad_request(endpoint: Endpoint, field: str, literal: str) -> None:
    with pytest.raises(BadRequest, match=rf"'{field}' must be at most 9223372036854775807 \(2\^63 - 1\)"):
        parse_request(endpoint, _integer_body(endpoint, field, literal))


@pytest.mark.parametrize(("endpoint", "field"), _INTEGER_FIELDS)
@pytest.mark.parametrize("literal", ["4.5", "-1", "-1.0", "true", '"4"'])
def test_a_non_integral_value_is_a_bad_request_naming_the_field(
    endpoint: Endpoint, field: str, literal: str
) -> None:
    with pytest.raises(BadRequest, match=f"'{field}' must be a non-negative integer"):
        parse_request(endpoint, _integer_body(endpoint, field, literal))
