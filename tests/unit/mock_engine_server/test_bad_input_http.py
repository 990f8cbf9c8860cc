"""A client's bad input is a 400 with vLLM's JSON error body, never an engine failure (issue 19, item 10).

Over real HTTP (uvicorn on 127.0.0.1): wrong types for every field each endpoint reads, bodies that are not
JSON objects, and token ids that are no character. vLLM answers these with
`{"error": {"message", "type": "BadRequestError", "param", "code": 400}}`; the mock used to answer 500
text/plain, which a gateway must count against the replica.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.server import MockEngineApp, MockEngineConfig
from tests.servers import ServerThread

from .conftest import CHAT, COMPLETIONS, MODEL, TIMEOUT, stats

pytestmark = pytest.mark.timeout(60)
EMBEDDINGS, TOKENIZE, DETOKENIZE = "/v1/embeddings", "/tokenize", "/detokenize"
ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS, TOKENIZE, DETOKENIZE)
HUGE_INT = b"1000000000000000000000000000000"  # orjson reads an integer past 64 bits as a float
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = MockEngineApp(
        MockEngineConfig(model=MODEL, default_max_tokens=4), FixedDelayCore(0.0, 0.0), FaultSettings()
    )
    server = ServerThread(app, "mock-engine-bad-input").start()
    yield server.url
    server.stop()


def _raw(body: dict[str, Any], **raw_fields: bytes) -> bytes:
    """`body` as JSON with some fields spliced in verbatim (numbers no Python value encodes the same)."""
    text = orjson.dumps(body)
    for name, value in raw_fields.items():
        text = text[:-1] + b',"' + name.encode() + b'":' + value + b"}"
    return text


def _completion(**fields: Any) -> bytes:
    return orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2, **fields})


def _chat(**fields: Any) -> bytes:
    return orjson.dumps({"model": MODEL, "messages": USER, "max_tokens": 2, **fields})


def _embed(value: Any) -> bytes:
    return orjson.dumps({"model": MODEL, "input": value})


def _tokenize(value: Any) -> bytes:
    return orjson.dumps({"model": MODEL, "prompt": value})


def _detokenize(value: Any) -> bytes:
    return orjson.dumps({"model": MODEL, "tokens": value})


BAD_FIELDS: list[tuple[str, bytes, str]] = [
    # completions: prompt is a string, strings, token ids or lists of token ids
    (COMPLETIONS, _completion(prompt=7), "prompt"),
    (COMPLETIONS, _completion(prompt=True), "prompt"),
    (COMPLETIONS, _completion(prompt=False), "prompt"),
    (COMPLETIONS, _completion(prompt=1.5), "prompt"),
    (COMPLETIONS, _raw({"model": MODEL, "max_tokens": 2}, prompt=HUGE_INT), "prompt"),
    (COMPLETIONS, _completion(prompt={"text": "hi"}), "prompt"),
    (COMPLETIONS, _completion(prompt=["a", 1]), "prompt"),
    (COMPLETIONS, _completion(prompt=[None]), "prompt"),
    (COMPLETIONS, _completion(prompt=[True]), "prompt"),
    (COMPLETIONS, _completion(prompt=[[1, "x"]]), "prompt"),
    (COMPLETIONS, _completion(max_tokens=True), "max_tokens"),
    (COMPLETIONS, _completion(max_tokens=2.5), "max_tokens"),
    (COMPLETIONS, _completion(max_tokens=[2]), "max_tokens"),
    (COMPLETIONS, _raw({"model": MODEL, "prompt": "hi"}, max_tokens=HUGE_INT), "max_tokens"),
    (COMPLETIONS, _completion(max_tokens=None, max_completion_tokens={}), "max_completion_tokens"),
    (COMPLETIONS, _completion(stream="yes"), "stream"),
    (COMPLETIONS, _completion(stream=1), "stream"),
    (COMPLETIONS, _completion(stream=True, stream_options=[1]), "stream_options"),
    (COMPLETIONS, _completion(model=5), "model"),
    (COMPLETIONS, _completion(seed=1.5), "seed"),
    # chat: messages are objects with a string role and a string, null or array content
    (CHAT, _chat(messages=[1]), "messages"),
    (CHAT, _chat(messages=["hi"]), "messages"),
    (CHAT, _chat(messages=[{"role": 1, "content": "x"}]), "messages"),
    (CHAT, _chat(messages=[{"role": ["user"], "content": "x"}]), "messages"),
    (CHAT, _chat(messages=[{"role": "user", "content": 5}]), "messages"),
    (CHAT, _chat(messages=[{"role": "user", "content": {"text": "x"}}]), "messages"),
    (CHAT, _chat(messages=[{"role": "user", "content": [1]}]), "messages"),
    (CHAT, _chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]), "messages"),
    (CHAT, _chat(messages={"role": "user"}), "messages"),
    (CHAT, _chat(max_completion_tokens=False), "max_completion_tokens"),
    (CHAT, _chat(stream={"on": True}), "stream"),
    (CHAT, _chat(stream=True, stream_options="include_usage"), "stream_options"),
    (CHAT, _chat(model=["m"]), "model"),
    # embeddings: input has the prompt's shapes
    (EMBEDDINGS, _embed(5), "input"),
    (EMBEDDINGS, _embed(False), "input"),
    (EMBEDDINGS, _embed({"a": 1}), "input"),
    (EMBEDDINGS, _embed([1.5]), "input"),
    (EMBEDDINGS, _embed(["a", 1]), "input"),
    (EMBEDDINGS, _embed([[None]]), "input"),
    # tokenize: the prompt is a string
    (TOKENIZE, _tokenize(5), "prompt"),
    (TOKENIZE, _tokenize(True), "prompt"),
    (TOKENIZE, _tokenize(["a"]), "prompt"),
    (TOKENIZE, orjson.dumps({"model": 5, "prompt": "a"}), "model"),
    # detokenize: tokens are integer ids of this mock's vocabulary (Unicode scalar values)
    (DETOKENIZE, _detokenize("abc"), "tokens"),
    (DETOKENIZE, _detokenize(5), "tokens"),
    (DETOKENIZE, _detokenize(True), "tokens"),
    (DETOKENIZE, _detokenize({"a": 1}), "tokens"),
    (DETOKENIZE, _detokenize([1.5]), "tokens"),
    (DETOKENIZE, _detokenize(["a"]), "tokens"),
    (DETOKENIZE, _detokenize([None]), "tokens"),
    (DETOKENIZE, _detokenize([True]), "tokens"),
    (DETOKENIZE, _detokenize([[104]]), "tokens"),
    (DETOKENIZE, _detokenize([-1]), "tokens"),
    (DETOKENIZE, _detokenize([0x110000]), "tokens"),
    (DETOKENIZE, _detokenize([0xD800]), "tokens"),
    (DETOKENIZE, _detokenize([2**63]), "tokens"),
    (DETOKENIZE, b'{"tokens": [' + HUGE_INT + b"]}", "tokens"),
]


def _bad_request(response: httpx.Response) -> dict[str, Any]:
    """The error object of a vLLM-shaped 400; fails the test on anything else."""
    assert response.status_code == 400, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.mark.parametrize(("path", "content", "param"), BAD_FIELDS, ids=lambda v: str(v)[:40])
def test_a_wrong_type_is_a_400_naming_the_field(url: str, path: str, content: bytes, param: str) -> None:
    response = httpx.post(url + path, content=content, timeout=TIMEOUT)
    assert _bad_request(response)["param"] == param


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize(
    "content", [b"[]", b"1", b"null", b'"x"', b"true", b"{", b"", b"\xff\xfe", b'{"a": 1e400}']
)
def test_a_body_that_is_not_a_json_object_is_a_400(url: str, path: str, content: bytes) -> None:
    error = _bad_request(httpx.post(url + path, content=content, timeout=TIMEOUT))
    assert error["param"] is None


def test_bad_input_draws_no_fault_and_starts_nothing(url: str) -> None:
    """Validation comes before the fault decision: even with every request failing, bad input is a 400."""
    httpx.post(url + "/mock/faults", json={"error_rate": 1.0, "error_status": 503}, timeout=TIMEOUT)
    try:
        before = stats(url)
        for path, content, param in BAD_FIELDS[::5]:
            response = httpx.post(url + path, content=content, timeout=TIMEOUT)
            assert _bad_request(response)["param"] == param
        after = stats(url)
    finally:
        httpx.delete(url + "/mock/faults", timeout=TIMEOUT)
    assert after["started"] == before["started"]
    assert after["failed_injected"] == before["failed_injected"]


GOOD: list[tuple[str, dict[str, Any]]] = [
    (COMPLETIONS, {"prompt": ["a", "b"], "max_tokens": 2}),
    (COMPLETIONS, {"prompt": [1, 2, 3], "max_tokens": 2}),
    (COMPLETIONS, {"prompt": [[1, 2], [3]], "max_tokens": 2}),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 2.0, "stream": None, "stream_options": None}),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": "2", "seed": -3}),
    (CHAT, {"messages": [{"role": "user", "content": None}], "max_completion_tokens": 1}),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "x"}]}]}),
    (CHAT, {"messages": USER, "stream": False, "stream_options": {"include_usage": True}}),
    (EMBEDDINGS, {"input": [[1, 2], [3]]}),
    (EMBEDDINGS, {"input": ["a", "b"]}),
    (TOKENIZE, {"prompt": "héllo ✓"}),
    (DETOKENIZE, {"tokens": [104, 0x1F600, 0x10FFFF]}),
]


@pytest.mark.parametrize(("path", "fields"), GOOD, ids=lambda v: str(v)[:40])
def test_every_shape_vllm_accepts_is_still_served(url: str, path: str, fields: dict[str, Any]) -> None:
    response = httpx.post(url + path, json={"model": MODEL, **fields}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text


def test_detokenize_inverts_tokenize_for_every_character(url: str) -> None:
    text = "a\u00e9\u4e2d\U0001f600\x00"
    tokens = [ord(ch) for ch in text]
    response = httpx.post(url + DETOKENIZE, json={"tokens": tokens}, timeout=TIMEOUT)
    assert response.status_code == 200 and response.json() == {"prompt": text}


@pytest.mark.parametrize("field", ["stall_after_tokens", "crash_after_tokens"])
def test_a_fault_count_past_64_bits_is_refused_not_a_500(url: str, field: str) -> None:
    content = b'{"' + field.encode() + b'": 1e300}'
    response = httpx.post(url + "/mock/faults", content=content, timeout=TIMEOUT)
    try:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == field and error["type"] == "invalid_fault_settings"
        assert httpx.get(url + "/mock/faults", timeout=TIMEOUT).status_code == 200
    finally:
        httpx.delete(url + "/mock/faults", timeout=TIMEOUT)
