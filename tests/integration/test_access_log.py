"""The structured access log (issue 17, item 3): one JSON line per request with the fields of
docs/OPERATIONS.md's table, errors and slow requests always kept under sampling, never a prompt or an
API key."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.tracing_fixtures import (
    MODEL,
    PROMPT,
    PROMPT_WORDS,
    AccessLines,
    capture_access_log,
    start_engine,
)
from tests.servers import ServerThread, gateway_settings, start_gateway, wait_until

CHAT = "/v1/chat/completions"
API_KEY = "sk-team-a-secret-9090"
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"


def documented_fields() -> list[str]:
    """The field column of the access-log table in docs/OPERATIONS.md."""
    text = OPERATIONS.read_text()
    section = text.split("## Access log", 1)[1]
    table = section.split("| field |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE)


@pytest.fixture
def lines() -> Iterator[AccessLines]:
    yield from capture_access_log()


@pytest.fixture
def servers() -> Iterator[list[ServerThread]]:
    started: list[ServerThread] = []
    yield started
    for server in reversed(started):
        server.stop()


def _gateway(
    servers: list[ServerThread], tenant: dict[str, Any] | None = None, **access_log: Any
) -> ServerThread:
    engine = start_engine()
    servers.append(engine)
    pool = {"model": MODEL, "engine": "vllm", "replicas": {"static": [engine.url]}}
    raw = gateway_settings([pool], access_log={"enabled": True, "stream": "none", **access_log})
    key_hashes = [hashlib.sha256(API_KEY.encode()).hexdigest()]
    raw["tenants"] = [{"name": "team-a", "api_key_hashes": key_hashes, **(tenant or {})}]
    gateway = start_gateway(raw)
    servers.append(gateway)
    return gateway


def _post(
    gateway: ServerThread, model: str = MODEL, stream: bool = False, key: str = API_KEY
) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 4,
        "stream": stream,
    }
    return httpx.post(gateway.url + CHAT, json=body, headers={"authorization": f"Bearer {key}"}, timeout=10)


def _no_secrets(raw_lines: list[str]) -> None:
    for line in raw_lines:
        for word in (*PROMPT_WORDS, API_KEY):
            assert word not in line


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_one_line_per_request_with_the_documented_fields(
    servers: list[ServerThread], lines: AccessLines, stream: bool
) -> None:
    gateway = _gateway(servers)
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 4,
        "stream": stream,
    }
    headers = {
        "authorization": f"Bearer {API_KEY}",
        "traceparent": traceparent,
        "x-gateway-priority": "batch",
    }
    answer = httpx.post(gateway.url + CHAT, json=body, headers=headers, timeout=10)
    assert answer.status_code == 200
    assert wait_until(lambda: len(lines.lines) == 1)
    line = lines.parsed()[0]
    assert list(line) == documented_fields()
    assert line["request_id"] == answer.headers["x-request-id"]
    assert line["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"  # the client's, tracing being off
    assert (line["tenant"], line["model"], line["pool"], line["priority"]) == (
        "team-a",
        MODEL,
        MODEL,
        "batch",
    )
    assert line["stream"] is stream and line["endpoint"] == CHAT
    assert line["replica"] == answer.headers["x-gateway-replica"] and line["replicas_tried"] == [
        line["replica"]
    ]
    assert line["route_policy"] and line["route_branch"]
    assert (line["status"], line["outcome"], line["reason"]) == (200, "success", None)
    assert (line["retries"], line["continuations"]) == (0, 0)
    assert line["tokens_in"] > 0 and line["tokens_out"] == 4
    assert 0 < line["ttft_ms"] <= line["duration_ms"] and line["queue_ms"] >= 0
    _no_secrets(lines.lines)
    assert len(lines.lines) == 1


def test_sampling_keeps_errors_and_drops_other_lines(servers: list[ServerThread], lines: AccessLines) -> None:
    gateway = _gateway(servers, sample_ratio=0.0, slow_request_ms=None)
    for _ in range(3):
        assert _post(gateway).status_code == 200
    assert _post(gateway, model="no-such-model").status_code == 404
    assert _post(gateway, key="sk-wrong-key-1234").status_code == 401
    assert wait_until(lambda: len(lines.lines) == 2)
    missing, refused = lines.parsed()
    assert (missing["status"], missing["outcome"], missing["pool"]) == (404, "model_not_found", None)
    assert (refused["status"], refused["outcome"], refused["tenant"]) == (401, "unauthorized", None)
    assert refused["replicas_tried"] == [] and refused["ttft_ms"] is None
    _no_secrets(lines.lines)
    assert "sk-wrong-key-1234" not in "".join(lines.lines)
    assert _post(gateway).status_code == 200  # still sampled out
    assert len(lines.lines) == 2


def test_a_refusal_is_logged_with_the_status_the_client_got(
    servers: list[ServerThread], lines: AccessLines
) -> None:
    """A 429 whose class inherits its status (`RateLimited` from `Overloaded`) is logged as 429, not
    500."""
    gateway = _gateway(servers, tenant={"requests_per_min": 1}, sample_ratio=0.0, slow_request_ms=None)
    assert _post(gateway).status_code == 200
    assert _post(gateway).status_code == 429
    assert wait_until(lambda: len(lines.lines) == 1)
    line = lines.parsed()[0]
    assert (line["status"], line["outcome"], line["tenant"]) == (429, "rate_limited", "team-a")


def test_slow_requests_are_always_kept(servers: list[ServerThread], lines: AccessLines) -> None:
    gateway = _gateway(servers, sample_ratio=0.0, slow_request_ms=0.001)
    assert _post(gateway, stream=True).status_code == 200
    assert wait_until(lambda: len(lines.lines) == 1)
    assert lines.parsed()[0]["outcome"] == "success"


def test_an_upstream_failure_names_the_replicas_tried_and_the_reason(
    servers: list[ServerThread], lines: AccessLines
) -> None:
    broken = start_engine(fail_status=500)
    servers.append(broken)
    pool = {
        "model": MODEL,
        "engine": "vllm",
        "replicas": {"static": [broken.url]},
        "retries": {"max_attempts": 1},
    }
    gateway = start_gateway(gateway_settings([pool], access_log={"enabled": True, "stream": "none"}))
    servers.append(gateway)
    assert _post(gateway).status_code == 500
    assert wait_until(lambda: len(lines.lines) == 1)
    line = lines.parsed()[0]
    assert (line["status"], line["outcome"], line["reason"]) == (500, "upstream_status", "upstream_status")
    assert line["replicas_tried"] == [line["replica"]] and len(line["replicas_tried"]) == 1


def test_requests_outside_the_serve_path_have_a_line_but_probes_do_not(
    servers: list[ServerThread], lines: AccessLines
) -> None:
    """An unknown route (404), a wrong method on a proxied path (405) and `GET /v1/models` each have a
    line with the documented fields; `/healthz`, `/readyz` and `/metrics` have none."""
    gateway = _gateway(servers)
    auth = {"authorization": f"Bearer {API_KEY}"}
    assert httpx.get(gateway.url + "/healthz").status_code == 200
    assert httpx.get(gateway.url + "/readyz").status_code == 200
    assert httpx.get(gateway.url + "/metrics").status_code == 200
    missing = httpx.get(gateway.url + "/v1/nowhere", headers={"x-request-id": "ops-404"})
    wrong = httpx.get(gateway.url + CHAT, headers=auth)
    models = httpx.get(gateway.url + "/v1/models", headers=auth)
    assert (missing.status_code, wrong.status_code, models.status_code) == (404, 405, 200)
    assert wait_until(lambda: len(lines.lines) == 3)
    by_status = {line["status"]: line for line in lines.parsed()}
    assert all(list(line) == documented_fields() for line in by_status.values())
    assert (by_status[404]["outcome"], by_status[404]["endpoint"], by_status[404]["method"]) == (
        "not_found",
        "/v1/nowhere",
        "GET",
    )
    assert by_status[404]["request_id"] == "ops-404" and by_status[404]["tenant"] is None
    assert (by_status[405]["outcome"], by_status[405]["endpoint"], by_status[405]["tenant"]) == (
        "method_not_allowed",
        CHAT,
        "team-a",
    )
    assert (by_status[200]["outcome"], by_status[200]["endpoint"], by_status[200]["tenant"]) == (
        "success",
        "/v1/models",
        "team-a",
    )
    assert by_status[200]["reason"] is None and by_status[200]["replicas_tried"] == []
    _no_secrets(lines.lines)


def test_an_early_refusal_names_the_model_and_endpoint_it_knows(
    servers: list[ServerThread], lines: AccessLines
) -> None:
    gateway = _gateway(servers)
    assert _post(gateway, model="no-such-model").status_code == 404
    assert _post(gateway, key="sk-wrong-key-1234").status_code == 401
    headers = {"authorization": f"Bearer {API_KEY}", "x-gateway-ttft-timeout-ms": "soon"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}
    assert httpx.post(gateway.url + CHAT, json=body, headers=headers).status_code == 400
    assert wait_until(lambda: len(lines.lines) == 3)
    missing, refused, bad_header = lines.parsed()
    assert (missing["outcome"], missing["model"], missing["endpoint"], missing["stream"]) == (
        "model_not_found",
        "no-such-model",
        CHAT,
        False,
    )
    assert (refused["outcome"], refused["model"], refused["endpoint"], refused["method"]) == (
        "unauthorized",
        None,  # refused before its body was read
        CHAT,
        "POST",
    )
    assert (bad_header["outcome"], bad_header["model"], bad_header["endpoint"]) == (
        "bad_request",
        MODEL,
        CHAT,
    )


def test_a_failed_try_is_logged_with_what_it_was_charged_to(
    servers: list[ServerThread], lines: AccessLines
) -> None:
    broken = start_engine(fail_status=500)
    servers.append(broken)
    pool = {
        "model": MODEL,
        "engine": "vllm",
        "replicas": {"static": [broken.url]},
        "retries": {"max_attempts": 1},
    }
    gateway = start_gateway(gateway_settings([pool], access_log={"enabled": True, "stream": "none"}))
    servers.append(gateway)
    assert _post(gateway).status_code == 500
    assert wait_until(lambda: len(lines.lines) == 1)
    line = lines.parsed()[0]
    assert line["attribution"] == [{"replica": line["replica"], "kind": "status_5xx", "cause": "replica"}]
