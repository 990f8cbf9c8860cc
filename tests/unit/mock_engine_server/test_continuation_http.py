"""Resuming a broken stream on another replica, over plain OpenAI HTTP (uvicorn on 127.0.0.1): the text so
far plus the continuation equals the unbroken run, token for token, on the fixed-delay and physics cores."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from mock_engine.faults import FaultSettings
from mock_engine.physics import PhysicsCore, load_profile
from mock_engine.server import MockEngineApp, MockEngineConfig
from mock_engine.text import estimate_tokens
from tests.servers import ServerThread

from .conftest import CHAT, COMPLETIONS, MODEL, TIMEOUT, stats

Engine = Callable[..., ServerThread]
pytestmark = pytest.mark.timeout(60)
DEFAULT_MAX = 8  # the conftest engine's default_max_tokens
MESSAGES = [
    {"role": "system", "content": "You answer in one sentence."},
    {"role": "user", "content": "What does the gateway do?"},
]


@pytest.fixture
def physics_engine() -> Iterator[Callable[[], ServerThread]]:
    started: list[ServerThread] = []

    def factory() -> ServerThread:
        config = MockEngineConfig(model=MODEL, default_max_tokens=DEFAULT_MAX, speed=50.0)
        app = MockEngineApp(config, PhysicsCore(load_profile("tiny")), FaultSettings())
        server = ServerThread(app, "mock-engine-physics").start()
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


@dataclass
class Answer:
    """A generation as a client read it, streamed or not."""

    pieces: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    error: Exception | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def _piece(choice: dict[str, Any]) -> str:
    if "delta" in choice:
        return str(choice["delta"].get("content") or "")
    return str(choice.get("text") or "")


def generate(url: str, path: str, body: dict[str, Any]) -> Answer:
    """POST a generation; streams are read chunk by chunk, and a transport error ends the read."""
    answer = Answer()
    with httpx.Client(timeout=TIMEOUT) as client:
        if not body.get("stream"):
            response = client.post(url + path, json=body)
            assert response.status_code == 200, response.text
            data = response.json()
            choice = data["choices"][0]
            answer.pieces = [choice["message"]["content"] if "message" in choice else choice["text"]]
            answer.finish_reason, answer.usage = choice["finish_reason"], data["usage"]
            return answer
        with client.stream("POST", url + path, json=body) as response:
            assert response.status_code == 200
            try:
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = orjson.loads(line[len("data: ") :])
                    if event.get("usage"):
                        answer.usage = event["usage"]
                    for choice in event["choices"]:
                        if choice["finish_reason"] is not None:
                            answer.finish_reason = choice["finish_reason"]
                        elif _piece(choice):
                            answer.pieces.append(_piece(choice))
            except httpx.TransportError as exc:
                answer.error = exc
    return answer


def chat_request(stream: bool, max_tokens: int | None = 12, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": list(MESSAGES), "stream": stream, **extra}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def chat_continuation(
    original: dict[str, Any], so_far: str, sent_tokens: int, stream: bool
) -> dict[str, Any]:
    """What a gateway sends to resume `original` after `sent_tokens` tokens whose text was `so_far`."""
    body = dict(original, stream=stream, continue_final_message=True, add_generation_prompt=False)
    body["messages"] = [*original["messages"], {"role": "assistant", "content": so_far}]
    if stream:
        body["stream_options"] = {"include_usage": True}
    if "max_tokens" in original:
        body["max_tokens"] = original["max_tokens"] - sent_tokens
    return body


def completion_continuation(
    original: dict[str, Any], so_far: str, sent_tokens: int, stream: bool
) -> dict[str, Any]:
    body = dict(original, prompt=original["prompt"] + so_far, stream=stream)
    if stream:
        body["stream_options"] = {"include_usage": True}
    if "max_tokens" in original:
        body["max_tokens"] = original["max_tokens"] - sent_tokens
    return body


# --- chat --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 1, 5, 11])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
@pytest.mark.parametrize("core", ["fixed", "physics"])
def test_a_chat_stream_cut_by_a_crash_resumes_on_another_replica(
    engine: Engine, physics_engine: Callable[[], ServerThread], k: int, stream: bool, core: str
) -> None:
    broken = engine(FaultSettings(crash_after_tokens=k))
    other = engine() if core == "fixed" else physics_engine()
    original = chat_request(stream=True, seed=42)
    unbroken = generate(other.url, CHAT, original)
    assert len(unbroken.pieces) == 12 and unbroken.finish_reason == "length"

    cut = generate(broken.url, CHAT, original)
    assert isinstance(cut.error, httpx.ReadError) and len(cut.pieces) == k
    resumed = generate(other.url, CHAT, chat_continuation(original, cut.text, k, stream))

    assert cut.text + resumed.text == unbroken.text
    if stream:
        assert cut.pieces + resumed.pieces == unbroken.pieces, "token for token"
    assert resumed.finish_reason == "length"
    contents = [m["content"] for m in MESSAGES] + [cut.text]
    assert resumed.usage == {
        "prompt_tokens": estimate_tokens("\n".join(contents)),
        "completion_tokens": 12 - k,
        "total_tokens": estimate_tokens("\n".join(contents)) + 12 - k,
    }


@pytest.mark.parametrize("k", [0, 3, DEFAULT_MAX])
def test_a_chat_continuation_without_max_tokens_stops_where_the_unbroken_run_stops(
    engine: Engine, k: int
) -> None:
    server = engine()
    original = chat_request(stream=False, max_tokens=None)
    unbroken = generate(server.url, CHAT, original)
    assert unbroken.finish_reason == "stop" and unbroken.usage is not None
    assert unbroken.usage["completion_tokens"] == DEFAULT_MAX
    so_far = "".join(generate(server.url, CHAT, chat_request(stream=True, max_tokens=DEFAULT_MAX)).pieces[:k])
    resumed = generate(server.url, CHAT, chat_continuation(original, so_far, k, stream=True))
    assert so_far + resumed.text == unbroken.text
    assert resumed.finish_reason == "stop" and resumed.usage is not None
    assert resumed.usage["completion_tokens"] == DEFAULT_MAX - k


def test_the_seed_selects_the_text_and_a_continuation_needs_the_same_seed(engine: Engine) -> None:
    server = engine()
    seven = generate(server.url, CHAT, chat_request(stream=False, seed=7)).text
    assert generate(server.url, CHAT, chat_request(stream=False, seed=7)).text == seven
    assert generate(server.url, CHAT, chat_request(stream=False, seed=8)).text != seven
    so_far = seven[: len(seven) // 2].rsplit(" ", 1)[0]
    n = so_far.count(" ")
    same = generate(server.url, CHAT, chat_continuation(chat_request(False, seed=7), so_far, n, False))
    other = generate(server.url, CHAT, chat_continuation(chat_request(False, seed=8), so_far, n, False))
    assert so_far + same.text == seven and so_far + other.text != seven


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"continue_final_message": True, "add_generation_prompt": True}, "add_generation_prompt"),
        ({"continue_final_message": True}, "continue_final_message"),  # last message is the user's
        ({"seed": "x"}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_invalid_continuations_are_400_before_any_fault(
    engine: Engine, extra: dict[str, Any], param: str
) -> None:
    server = engine(FaultSettings(error_rate=1.0, error_status=503))
    body = {"model": MODEL, "messages": list(MESSAGES), **extra}
    if param == "add_generation_prompt":
        body["messages"] = [*MESSAGES, {"role": "assistant", "content": " the"}]
    response = httpx.post(server.url + CHAT, json=body, timeout=TIMEOUT)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == 400 and error["type"] == "BadRequestError"
    assert stats(server.url)["failed_injected"] == 0 and stats(server.url)["started"] == 0


# --- completions -------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 2, 9])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_a_completions_stream_cut_by_a_crash_resumes_on_another_replica(
    engine: Engine, k: int, stream: bool
) -> None:
    broken, other = engine(FaultSettings(crash_after_tokens=k)), engine()
    original = {"model": MODEL, "prompt": "The mock engine", "max_tokens": 10, "stream": True}
    unbroken = generate(other.url, COMPLETIONS, original)
    cut = generate(broken.url, COMPLETIONS, original)
    assert isinstance(cut.error, httpx.ReadError) and len(cut.pieces) == k
    resumed = generate(other.url, COMPLETIONS, completion_continuation(original, cut.text, k, stream))
    assert cut.text + resumed.text == unbroken.text and resumed.finish_reason == "length"
    prompt_tokens = estimate_tokens("The mock engine" + cut.text)
    assert resumed.usage == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 10 - k,
        "total_tokens": prompt_tokens + 10 - k,
    }


@pytest.mark.parametrize("k", [0, 5])
def test_a_completions_continuation_without_max_tokens_stops_with_the_unbroken_run(
    engine: Engine, k: int
) -> None:
    server = engine()
    original = {"model": MODEL, "prompt": "Once", "stream": False}
    unbroken = generate(server.url, COMPLETIONS, original)
    assert unbroken.finish_reason == "stop" and len(unbroken.text.split()) == DEFAULT_MAX
    so_far = "".join(" " + w for w in unbroken.text.split()[:k])
    resumed = generate(server.url, COMPLETIONS, completion_continuation(original, so_far, k, stream=True))
    assert so_far + resumed.text == unbroken.text and resumed.finish_reason == "stop"


# --- prefix cache -------------------------------------------------------------------------------------


def test_on_the_physics_core_a_continuation_hits_the_original_prompts_cached_blocks(
    physics_engine: Callable[[], ServerThread],
) -> None:
    server = physics_engine()
    long_prompt = "context " * 40  # 320 chars: 5 full blocks of 16 tokens (64 chars) on the tiny profile
    original = {"model": MODEL, "messages": [{"role": "user", "content": long_prompt}], "max_tokens": 6}
    unbroken = generate(server.url, CHAT, original)
    core = server.app.driver.core
    hits_before = core.stats().prefix_cache_hits_tokens
    so_far = "".join(" " + w for w in unbroken.text.split()[:2])
    resumed = generate(server.url, CHAT, chat_continuation(original, so_far, 2, stream=False))
    assert so_far + resumed.text == unbroken.text
    assert core.stats().prefix_cache_hits_tokens - hits_before == 5 * 16
