"""Each fault as an HTTP client (httpx) sees it, against a mock engine served by uvicorn on 127.0.0.1."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from mock_engine.faults import FaultInjector, FaultSettings
from tests.servers import ServerThread

from .conftest import CHAT, COMPLETIONS, MODEL, TIMEOUT, chat_body, read_stream, stats, wait_until

Engine = Callable[..., ServerThread]
pytestmark = pytest.mark.timeout(30)


def _post_faults(server: ServerThread, **changes: Any) -> dict[str, Any]:
    response = httpx.post(server.url + "/mock/faults", json=changes, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _connect(server: ServerThread) -> str:
    """'accepted' or 'refused' for a fresh TCP connection to the server's port."""
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=1.0):
            return "accepted"
    except ConnectionRefusedError:
        return "refused"


def _invariant_holds(server: ServerThread) -> bool:
    s = stats(server.url)
    return s["started"] == s["finished"] + s["aborted"] + s["crashed_injected"] + s["active"]


# --- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "retry_after"), [(500, None), (503, "3"), (429, "1")])
def test_injected_error_status_body_and_retry_after(
    engine: Engine, status: int, retry_after: str | None
) -> None:
    server = engine(
        FaultSettings(error_rate=1.0, error_status=status, retry_after_s=2.5 if status == 503 else 1)
    )
    response = httpx.post(server.url + CHAT, json=chat_body(stream=True), timeout=TIMEOUT)
    assert response.status_code == status
    assert response.headers.get("retry-after") == retry_after
    assert response.json()["error"]["message"] == "injected fault"
    assert stats(server.url)["failed_injected"] == 1 and stats(server.url)["started"] == 0


def test_errors_follow_the_seeded_sequence(engine: Engine) -> None:
    settings = FaultSettings(error_rate=0.4, error_status=503)
    server = engine(settings, seed=42)
    with httpx.Client(timeout=TIMEOUT) as client:
        body = {"model": MODEL, "prompt": "x"}
        seen = [client.post(server.url + COMPLETIONS, json=body).status_code for _ in range(25)]
    model = FaultInjector(settings, random.Random(42))
    expected = [503 if model.plan().error_status else 200 for _ in range(25)]
    assert seen == expected and 503 in seen and 200 in seen


def test_error_rate_changed_at_run_time(engine: Engine) -> None:
    server = engine()
    url = server.url + CHAT
    assert httpx.post(url, json=chat_body(stream=False), timeout=TIMEOUT).status_code == 200
    _post_faults(server, error_rate=1.0, error_status=429, retry_after_s=4)
    refused = httpx.post(url, json=chat_body(stream=False), timeout=TIMEOUT)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "4"
    assert httpx.delete(server.url + "/mock/faults", timeout=TIMEOUT).json() == FaultSettings().as_dict()
    assert httpx.post(url, json=chat_body(stream=False), timeout=TIMEOUT).status_code == 200


# --- slow first token, jitter ----------------------------------------------------------------------


def test_slow_first_token_delays_only_the_first_content_token(engine: Engine) -> None:
    server = engine(FaultSettings(slow_first_token_ms=250), token_delay_ms=2)
    with httpx.Client(timeout=TIMEOUT) as client:
        read = read_stream(client, server.url, chat_body(max_tokens=6))
    role_at = read.events[0][0]
    assert read.events[0][1]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role_at < 0.2, "headers and role chunk come at once"
    times = read.token_times
    assert len(times) == 6 and read.done
    assert times[0] - role_at >= 0.24
    assert times[-1] - times[0] < 0.2, "later tokens keep their normal spacing"
    assert stats(server.url)["slowed_injected"] == 1


def test_slow_first_token_for_a_fraction_of_requests(engine: Engine) -> None:
    settings = FaultSettings(slow_first_token_ms=120, slow_first_token_rate=0.5)
    server = engine(settings, seed=3)
    model = FaultInjector(settings, random.Random(3))
    with httpx.Client(timeout=TIMEOUT) as client:
        for _ in range(8):
            t0 = time.monotonic()
            response = client.post(server.url + CHAT, json=chat_body(stream=False, max_tokens=2))
            elapsed = time.monotonic() - t0
            assert response.status_code == 200
            slow = model.plan().first_token_delay_s > 0
            assert (elapsed >= 0.115) if slow else (elapsed < 0.1), (slow, elapsed)
    assert 0 < stats(server.url)["slowed_injected"] < 8


def test_jitter_adds_the_seeded_pauses_between_tokens(engine: Engine) -> None:
    settings = FaultSettings(jitter_ms=30)
    server = engine(settings, seed=9, token_delay_ms=1)
    jitter = FaultInjector(settings, random.Random(9)).plan().jitter()
    expected_s = sum(jitter.next_s() for _ in range(10))
    with httpx.Client(timeout=TIMEOUT) as client:
        read = read_stream(client, server.url, chat_body(max_tokens=10))
    assert read.done and len(read.tokens) == 10
    spread = read.token_times[-1] - read.events[0][0]
    assert spread >= expected_s - 0.005
    assert spread < expected_s + 0.25
    gaps = [b - a for a, b in zip(read.token_times, read.token_times[1:], strict=False)]
    assert max(gaps) > 0.01, "some gaps show the jitter"


# --- stall ------------------------------------------------------------------------------------------


def test_stall_after_n_tokens_keeps_the_connection_open_and_silent(engine: Engine) -> None:
    server = engine(FaultSettings(stall_after_tokens=3))
    with httpx.Client(timeout=httpx.Timeout(5.0, read=0.4)) as client:
        read = read_stream(client, server.url, chat_body(max_tokens=8))
        assert read.status == 200 and len(read.tokens) == 3 and not read.done
        assert isinstance(read.error, httpx.ReadTimeout), "silence, not a close or a reset"
    counters = stats(server.url)
    assert counters["stalled_injected"] == 1
    assert wait_until(lambda: stats(server.url)["aborted"] == 1), "client left: counted aborted"
    assert stats(server.url)["active"] == 0 and _invariant_holds(server)


def test_stall_at_zero_tokens_sends_only_headers_and_role_chunk(engine: Engine) -> None:
    server = engine(FaultSettings(stall_after_tokens=0))
    with httpx.Client(timeout=httpx.Timeout(5.0, read=0.3)) as client:
        read = read_stream(client, server.url, chat_body())
    assert read.status == 200 and len(read.events) == 1 and read.tokens == []
    assert isinstance(read.error, httpx.ReadTimeout)


def test_stall_stays_open_while_the_client_waits(engine: Engine) -> None:
    server = engine(FaultSettings(stall_after_tokens=1))
    with (
        httpx.Client(timeout=TIMEOUT) as client,
        client.stream("POST", server.url + CHAT, json=chat_body()) as r,
    ):
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # role chunk
        assert wait_until(lambda: stats(server.url)["stalled_injected"] == 1), "the stall began"
        # Deliberate idle period, the behaviour under test: the stalled stream stays open and counted
        # active for as long as the client waits (nothing happens that could be waited for instead).
        time.sleep(0.5)
        assert stats(server.url)["active"] == 1 and stats(server.url)["aborted"] == 0
    assert wait_until(lambda: stats(server.url)["aborted"] == 1)


def test_stall_non_streamed_gets_no_response(engine: Engine) -> None:
    server = engine(FaultSettings(stall_after_tokens=2))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + CHAT, json=chat_body(stream=False), timeout=httpx.Timeout(5.0, read=0.3))
    assert wait_until(lambda: stats(server.url)["aborted"] == 1)


def test_stall_beyond_the_output_length_has_no_effect(engine: Engine) -> None:
    server = engine(FaultSettings(stall_after_tokens=50))
    with httpx.Client(timeout=TIMEOUT) as client:
        read = read_stream(client, server.url, chat_body(max_tokens=4))
    assert read.done and len(read.tokens) == 4 and stats(server.url)["stalled_injected"] == 0


def test_stall_after_the_last_token_withholds_finish_and_done(engine: Engine) -> None:
    server = engine(FaultSettings(stall_after_tokens=4))
    with httpx.Client(timeout=httpx.Timeout(5.0, read=0.3)) as client:
        read = read_stream(client, server.url, chat_body(max_tokens=4))
    assert len(read.tokens) == 4 and not read.done and isinstance(read.error, httpx.ReadTimeout)


def test_server_stop_ends_a_stalled_stream(engine: Engine) -> None:
    server = engine(FaultSettings(stall_after_tokens=0))
    with (
        httpx.Client(timeout=TIMEOUT) as client,
        client.stream("POST", server.url + CHAT, json=chat_body()) as r,
    ):
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        t0 = time.monotonic()
        server.stop()
        assert time.monotonic() - t0 < 2.0, "a stalled stream does not hold up shutdown"
        with pytest.raises(httpx.TransportError):
            for _ in lines:
                pass


# --- crash ------------------------------------------------------------------------------------------


def test_crash_mid_stream_resets_the_connection(engine: Engine) -> None:
    server = engine(FaultSettings(crash_after_tokens=3))
    with httpx.Client(timeout=TIMEOUT) as client:
        read = read_stream(client, server.url, chat_body(max_tokens=8))
    assert read.status == 200 and len(read.tokens) == 3 and not read.done
    assert isinstance(read.error, httpx.ReadError), repr(read.error)
    assert "reset" in str(read.error).lower()
    counters = stats(server.url)
    assert counters["crashed_injected"] == 1 and counters["aborted"] == 0 and counters["active"] == 0
    assert _invariant_holds(server)


def test_crash_before_any_token(engine: Engine) -> None:
    server = engine(FaultSettings(crash_after_tokens=0))
    with httpx.Client(timeout=TIMEOUT) as client:
        read = read_stream(client, server.url, chat_body())
    assert read.tokens == [] and isinstance(read.error, httpx.ReadError)


def test_crash_non_streamed_gets_no_response(engine: Engine) -> None:
    server = engine(FaultSettings(crash_after_tokens=2))
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        httpx.post(server.url + CHAT, json=chat_body(stream=False), timeout=TIMEOUT)
    assert stats(server.url)["crashed_injected"] == 1


def test_crash_for_a_fraction_follows_the_seed_and_the_server_keeps_serving(engine: Engine) -> None:
    settings = FaultSettings(crash_after_tokens=1, crash_rate=0.5)
    server = engine(settings, seed=11)
    model = FaultInjector(settings, random.Random(11))
    outcomes, expected = [], []
    for _ in range(10):
        with httpx.Client(timeout=TIMEOUT) as client:
            read = read_stream(client, server.url, chat_body(max_tokens=3))
        outcomes.append("crash" if read.error else "ok")
        expected.append("crash" if model.plan().crash_after_tokens is not None else "ok")
    assert outcomes == expected and "crash" in outcomes and "ok" in outcomes
    assert _invariant_holds(server)


# --- refuse ------------------------------------------------------------------------------------------


def test_refuse_connections_for_a_while_then_accept_again(engine: Engine) -> None:
    server = engine()
    assert _connect(server) == "accepted"
    answer = _post_faults(server, refuse_connections=True, refuse_for_s=0.6)
    assert answer["refuse_connections"] is True
    t0 = time.monotonic()
    assert _connect(server) == "refused"
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health", timeout=TIMEOUT)
    assert wait_until(lambda: _connect(server) == "accepted", 3.0)
    assert time.monotonic() - t0 >= 0.5
    assert httpx.get(server.url + "/mock/faults", timeout=TIMEOUT).json()["refuse_connections"] is False
    assert httpx.post(server.url + CHAT, json=chat_body(stream=False), timeout=TIMEOUT).status_code == 200


def test_refusal_closes_idle_keepalive_and_lets_in_flight_streams_finish(engine: Engine) -> None:
    server = engine(token_delay_ms=20)
    with httpx.Client(timeout=TIMEOUT) as pooled, httpx.Client(timeout=TIMEOUT) as streamer:
        assert pooled.get(server.url + "/health").status_code == 200  # an idle keep-alive connection now
        with streamer.stream("POST", server.url + CHAT, json=chat_body(max_tokens=20)) as stream:
            lines = stream.iter_lines()
            next(lines)
            server.app.set_faults_threadsafe({"refuse_connections": True})
            rest = list(lines)
        assert "data: [DONE]" in rest, "the in-flight stream finished"
        assert _connect(server) == "refused"
        with pytest.raises(httpx.ConnectError):
            pooled.get(server.url + "/health")
        settings = server.app.set_faults_threadsafe({"refuse_connections": False})
        assert settings.refuse_connections is False
        assert pooled.get(server.url + "/health").status_code == 200


def test_refuse_from_the_start(engine: Engine) -> None:
    server = engine(FaultSettings(refuse_connections=True, refuse_for_s=0.5))
    assert wait_until(lambda: _connect(server) == "refused", 1.0)
    assert wait_until(lambda: _connect(server) == "accepted", 3.0)


def test_refusal_can_be_toggled_repeatedly_and_the_server_stops_while_refusing(engine: Engine) -> None:
    server = engine()
    for _ in range(3):
        server.app.set_faults_threadsafe({"refuse_connections": True})
        assert _connect(server) == "refused"
        server.app.set_faults_threadsafe({"refuse_connections": False})
        assert httpx.get(server.url + "/health", timeout=TIMEOUT).status_code == 200
    server.app.set_faults_threadsafe({"refuse_connections": True})
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 2.0


# --- no fault ---------------------------------------------------------------------------------------


def test_no_fault_stream_is_complete(engine: Engine) -> None:
    server = engine()
    with httpx.Client(timeout=TIMEOUT) as client:
        read = read_stream(client, server.url, chat_body(max_tokens=5))
    assert read.done and len(read.tokens) == 5 and read.error is None
    assert stats(server.url)["finished"] == 1 and _invariant_holds(server)
