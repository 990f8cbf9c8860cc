"""Poison prompts as an HTTP client sees them: requests whose prompt contains the marker stall, fail or
crash before their first token, every time; every other request is served, with the same seeded faults."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from mock_engine.faults import POISON_ERROR_MESSAGE, FaultInjector, FaultSettings
from tests.servers import ServerThread

from .conftest import CHAT, COMPLETIONS, MODEL, TIMEOUT, chat_body, read_stream, stats, wait_until

Engine = Callable[..., ServerThread]
pytestmark = pytest.mark.timeout(30)
MARKER = "<<poison>>"
POISON = f"please {MARKER} me"


def _invariant_holds(server: ServerThread) -> bool:
    s = stats(server.url)
    return s["started"] == s["finished"] + s["aborted"] + s["crashed_injected"] + s["active"]


def _healthy(server: ServerThread) -> None:
    """A request without the marker is served in full, streamed and not."""
    with httpx.Client(timeout=TIMEOUT) as client:
        read = read_stream(client, server.url, chat_body(max_tokens=4, prompt="benign"))
        assert read.done and len(read.tokens) == 4 and read.error is None
        plain = client.post(server.url + COMPLETIONS, json={"model": MODEL, "prompt": "ok", "max_tokens": 3})
        assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 3


def test_poison_stall_sends_headers_and_role_then_silence(engine: Engine) -> None:
    server = engine(FaultSettings(poison_marker=MARKER))
    with httpx.Client(timeout=httpx.Timeout(5.0, read=0.4)) as client:
        for _ in range(2):  # every such request, no rate
            read = read_stream(client, server.url, chat_body(prompt=POISON))
            assert read.status == 200 and read.tokens == [] and not read.done
            assert read.events[0][1]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert len(read.events) == 1 and isinstance(read.error, httpx.ReadTimeout)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + CHAT,
            json=chat_body(stream=False, prompt=POISON),
            timeout=httpx.Timeout(5.0, read=0.3),
        )
    _healthy(server)
    counters = stats(server.url)
    assert counters["poisoned_injected"] == 3 and counters["stalled_injected"] == 3
    assert wait_until(lambda: stats(server.url)["aborted"] == 3) and _invariant_holds(server)


def test_poison_error_is_a_500_with_the_openai_error_body(engine: Engine) -> None:
    server = engine(FaultSettings(poison_marker=MARKER, poison_effect="error", retry_after_s=3))
    for stream in (True, False):
        response = httpx.post(
            server.url + CHAT, json=chat_body(stream=stream, prompt=POISON), timeout=TIMEOUT
        )
        assert response.status_code == 500 and "retry-after" not in response.headers
        assert response.json() == {
            "error": {"message": POISON_ERROR_MESSAGE, "type": "mock_engine_error", "code": 500}
        }
    _healthy(server)
    counters = stats(server.url)
    assert counters["poisoned_injected"] == 2 and counters["failed_injected"] == 2
    assert counters["started"] == 2 and counters["finished"] == 2, "only the healthy ones started"


def test_poison_crash_resets_the_connection_before_the_first_token(engine: Engine) -> None:
    server = engine(FaultSettings(poison_marker=MARKER, poison_effect="crash"))
    with httpx.Client(timeout=TIMEOUT) as client:
        read = read_stream(client, server.url, chat_body(prompt=POISON))
    assert read.status == 200 and read.tokens == [] and isinstance(read.error, httpx.ReadError)
    assert "reset" in str(read.error).lower()
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        httpx.post(server.url + CHAT, json=chat_body(stream=False, prompt=POISON), timeout=TIMEOUT)
    _healthy(server)
    counters = stats(server.url)
    assert counters["poisoned_injected"] == 2 and counters["crashed_injected"] == 2
    assert _invariant_holds(server)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (COMPLETIONS, {"model": MODEL, "prompt": f"x{MARKER}y", "max_tokens": 3}),
        (
            CHAT,
            {
                "model": MODEL,
                "messages": [
                    {"role": "system", "content": MARKER},
                    {"role": "user", "content": "innocent"},
                ],
            },
        ),
        (
            CHAT,
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": POISON}]}]},
        ),
    ],
    ids=["completions", "any-message", "content-parts"],
)
def test_the_marker_anywhere_in_the_prompt_poisons(engine: Engine, path: str, body: dict[str, Any]) -> None:
    server = engine(FaultSettings(poison_marker=MARKER, poison_effect="error"))
    assert httpx.post(server.url + path, json=body, timeout=TIMEOUT).status_code == 500
    assert stats(server.url)["poisoned_injected"] == 1


def test_other_endpoints_and_other_markers_are_not_poisoned(engine: Engine) -> None:
    server = engine(FaultSettings(poison_marker=MARKER, poison_effect="error"))
    url = server.url
    assert httpx.post(url + "/v1/embeddings", json={"input": POISON}, timeout=TIMEOUT).status_code == 200
    assert httpx.post(url + "/tokenize", json={"prompt": POISON}, timeout=TIMEOUT).status_code == 200
    near_miss = chat_body(stream=False, prompt="<<poison>")
    assert httpx.post(url + CHAT, json=near_miss, timeout=TIMEOUT).status_code == 200
    assert stats(url)["poisoned_injected"] == 0


def test_poison_set_at_run_time_shown_and_cleared(engine: Engine) -> None:
    server = engine()
    url = server.url
    body = chat_body(stream=False, prompt=POISON)
    assert httpx.post(url + CHAT, json=body, timeout=TIMEOUT).status_code == 200
    answer = httpx.post(
        url + "/mock/faults", json={"poison_marker": MARKER, "poison_effect": "error"}, timeout=TIMEOUT
    )
    assert answer.status_code == 200
    assert answer.json()["poison_marker"] == MARKER and answer.json()["poison_effect"] == "error"
    assert httpx.get(url + "/mock/faults", timeout=TIMEOUT).json()["poison_marker"] == MARKER
    assert httpx.post(url + CHAT, json=body, timeout=TIMEOUT).status_code == 500
    cleared = httpx.delete(url + "/mock/faults", timeout=TIMEOUT).json()
    assert cleared["poison_marker"] is None and cleared["poison_effect"] == "stall"
    assert httpx.post(url + CHAT, json=body, timeout=TIMEOUT).status_code == 200


def test_non_poison_requests_keep_their_seeded_faults(engine: Engine) -> None:
    """Poisoned requests take their draws too: the others see exactly the faults they would without poison."""
    rated = FaultSettings(error_rate=0.4, error_status=503)
    settings = FaultSettings(error_rate=0.4, error_status=503, poison_marker=MARKER, poison_effect="error")
    server = engine(settings, seed=21)
    prompts = [POISON if i % 3 == 0 else f"benign {i}" for i in range(24)]
    with httpx.Client(timeout=TIMEOUT) as client:
        seen = [
            client.post(
                server.url + COMPLETIONS, json={"model": MODEL, "prompt": p, "max_tokens": 1}
            ).status_code
            for p in prompts
        ]
    without_poison = FaultInjector(rated, random.Random(21))
    expected = [503 if without_poison.plan(p).error_status else 200 for p in prompts]
    for prompt, got, unpoisoned in zip(prompts, seen, expected, strict=True):
        assert got == (500 if MARKER in prompt else unpoisoned), prompt
    assert 503 in seen and 200 in seen
