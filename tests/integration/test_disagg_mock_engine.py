"""Disaggregated mock replicas over real HTTP on 127.0.0.1: both protocols' legs, refusals, transfer time.

The prefill and decode replicas are separate servers (as in production they are separate processes): the
decode claims the KV from the prefill replica over HTTP. Fixed-delay cores; the link is slowed so that the
transfer is the dominant, measurable wait.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mock_engine.disagg_params import Protocol, Role
from mock_engine.disagg_role import DisaggConfig
from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.physics.kv_link import KvLink
from mock_engine.server import MockEngineApp, MockEngineConfig
from tests.servers import ServerThread, free_port, start_mock_engine, wait_until

KV_BYTES_PER_TOKEN = 1000
LINK = KvLink("test", bandwidth_bytes_per_s=100_000)  # 100 tokens/s: 30 tokens take 0.3 s
FIRST_TOKEN_DELAY_S = 1.0
PROMPT = "x" * 120  # 30 tokens
ROOM = 2**63 - 5
BOOTSTRAP_TIMEOUT_S = 1.6  # above the 0.1 s head start + 1 s prefill of the pair test


def _start(role: Role, protocol: Protocol, **extra: Any) -> ServerThread:
    disagg = DisaggConfig(
        role=role,
        protocol=protocol,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
        link=LINK,
        engine_id=f"engine-{role}",
        **extra,
    )
    core = FixedDelayCore(FIRST_TOKEN_DELAY_S, 0.001)
    app = MockEngineApp(MockEngineConfig(model="m", disagg=disagg), core, FaultSettings())
    return ServerThread(app, f"mock-{protocol}-{role}").start()


@pytest.fixture
def vllm_pair() -> Iterator[tuple[ServerThread, ServerThread]]:
    prefill, decode = _start(Role.PREFILL, Protocol.VLLM), _start(Role.DECODE, Protocol.VLLM)
    yield prefill, decode
    prefill.stop()
    decode.stop()


@pytest.fixture
def sglang_pair() -> Iterator[tuple[ServerThread, ServerThread]]:
    prefill = _start(Role.PREFILL, Protocol.SGLANG)
    decode = _start(Role.DECODE, Protocol.SGLANG, bootstrap_timeout_s=BOOTSTRAP_TIMEOUT_S)
    yield prefill, decode
    prefill.stop()
    decode.stop()


def _stats(server: ServerThread) -> dict[str, int]:
    return dict(httpx.get(f"{server.url}/mock/stats").json())


def _idle(*servers: ServerThread) -> bool:
    return all(_stats(s)["active"] == 0 and _stats(s).get("kv_transfers_pending", 0) == 0 for s in servers)


def _stream_text(url: str, body: dict[str, Any]) -> tuple[float, str]:
    """(seconds from sending to the first content token, the whole streamed text)."""
    started, first_s, parts = time.monotonic(), None, []
    with httpx.stream("POST", f"{url}/v1/completions", json=body | {"stream": True}, timeout=10) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            text = httpx.Response(200, content=line[6:]).json()["choices"][0]["text"]
            if text and first_s is None:
                first_s = time.monotonic() - started
            parts.append(text)
    assert first_s is not None
    return first_s, "".join(parts)


def _prefill_leg(url: str, body: dict[str, Any]) -> httpx.Response:
    leg = body | {"stream": False, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    return httpx.post(f"{url}/v1/completions", json=leg, timeout=10)


def _aggregated_text(body: dict[str, Any]) -> str:
    server = start_mock_engine(model="m")
    try:
        return str(
            httpx.post(f"{server.url}/v1/completions", json=body, timeout=10).json()["choices"][0]["text"]
        )
    finally:
        server.stop()


def test_vllm_pair_serves_the_same_text_after_the_transfer(
    vllm_pair: tuple[ServerThread, ServerThread],
) -> None:
    prefill, decode = vllm_pair
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 5, "seed": 3}
    answer = _prefill_leg(prefill.url, body)
    assert answer.status_code == 200
    params = answer.json()["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine_id"] == "engine-prefill"
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", prefill.port)
    assert len(params["remote_block_ids"]) == 2  # ceil(30 / 16)
    assert isinstance(params["remote_request_id"], str) and params["tp_size"] == 1
    assert answer.json()["usage"]["completion_tokens"] == 1
    ttft_s, text = _stream_text(decode.url, body | {"kv_transfer_params": params})
    # transfer 30 tokens x 1000 B / 100 kB/s = 0.3 s; the 1 s prefill delay is skipped on the decode
    assert 0.3 <= ttft_s < 0.3 + 0.4
    assert text == _aggregated_text(body)
    assert wait_until(lambda: _idle(prefill, decode))
    assert _stats(prefill)["kv_transfers_claimed"] == 1
    assert _stats(decode)["kv_transfers_received"] == 1
    # the same params a second time: the transfer was claimed, the KV is gone
    again = httpx.post(f"{decode.url}/v1/completions", json=body | {"kv_transfer_params": params}, timeout=10)
    assert again.status_code == 400
    assert again.json()["error"]["param"] == "kv_transfer_params"


def test_vllm_decode_refuses_without_valid_params(vllm_pair: tuple[ServerThread, ServerThread]) -> None:
    prefill, decode = vllm_pair
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 3}
    params = _prefill_leg(prefill.url, body).json()["kv_transfer_params"]
    url = f"{decode.url}/v1/completions"
    cases = [
        {},
        {"kv_transfer_params": params | {"do_remote_prefill": False}},
        {"kv_transfer_params": params | {"remote_request_id": "nobody"}},
        {"kv_transfer_params": params | {"remote_engine_id": "another-engine"}},
        {"kv_transfer_params": params | {"remote_port": decode.port}},  # not a prefill replica
    ]
    for extra in cases:
        refused = httpx.post(url, json=body | extra, timeout=10)
        assert refused.status_code == 400, extra
        error = refused.json()["error"]
        assert (error["type"], error["param"], error["code"]) == (
            "BadRequestError",
            "kv_transfer_params",
            400,
        )
    other_prompt = httpx.post(
        url, json=body | {"prompt": PROMPT * 2, "kv_transfer_params": params}, timeout=10
    )
    assert other_prompt.status_code == 400
    unreachable = httpx.post(url, json=body | {"kv_transfer_params": params | {"remote_port": free_port()}})
    assert unreachable.status_code == 503
    # the first two are refused by the shape check, the other five by the claim
    assert _stats(decode)["started"] == 0 and _stats(decode)["kv_transfer_errors"] == 5


def test_vllm_prefill_serves_prefill_legs_only(vllm_pair: tuple[ServerThread, ServerThread]) -> None:
    prefill, _ = vllm_pair
    url = f"{prefill.url}/v1/completions"
    plain = httpx.post(url, json={"prompt": PROMPT, "max_tokens": 1}, timeout=10)
    assert plain.status_code == 400 and plain.json()["error"]["param"] == "kv_transfer_params"
    streamed = {
        "prompt": PROMPT,
        "max_tokens": 1,
        "stream": True,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    assert httpx.post(url, json=streamed, timeout=10).json()["error"]["param"] == "stream"


def test_sglang_pair_decode_waits_for_the_room(sglang_pair: tuple[ServerThread, ServerThread]) -> None:
    prefill, decode = sglang_pair
    info = httpx.get(f"{prefill.url}/get_server_info").json()
    assert (info["disaggregation_mode"], info["disaggregation_bootstrap_port"]) == ("prefill", prefill.port)
    body = {
        "model": "m",
        "prompt": PROMPT,
        "max_tokens": 4,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": info["disaggregation_bootstrap_port"],
        "bootstrap_room": ROOM,
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        decoded = pool.submit(_stream_text, decode.url, body)  # the decode may arrive first: it waits
        time.sleep(0.1)
        prefilled = pool.submit(httpx.post, f"{prefill.url}/v1/completions", json=body, timeout=10)
        ttft_s, text = decoded.result()
        answer = prefilled.result()
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 1
    # 0.1 s head start + 1 s prefill + 0.3 s transfer
    assert 1.4 <= ttft_s < 1.4 + 0.5
    fields = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
    assert text == _aggregated_text({k: v for k, v in body.items() if k not in fields})
    assert wait_until(lambda: _idle(prefill, decode))


def test_sglang_decode_refuses_bad_fields_and_times_out(
    sglang_pair: tuple[ServerThread, ServerThread],
) -> None:
    prefill, decode = sglang_pair
    url = f"{decode.url}/v1/completions"
    body = {"prompt": PROMPT, "max_tokens": 2, "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.port}
    missing = httpx.post(url, json=body, timeout=10)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "bootstrap_room"
    bad_port = httpx.post(url, json=body | {"bootstrap_room": 1, "bootstrap_port": "8998"}, timeout=10)
    assert bad_port.status_code == 400 and bad_port.json()["error"]["param"] == "bootstrap_port"
    started = time.monotonic()
    never = httpx.post(url, json=body | {"bootstrap_room": 42}, timeout=10)
    assert never.status_code == 500 and never.json()["error"]["type"] == "KVTransferError"
    assert BOOTSTRAP_TIMEOUT_S <= time.monotonic() - started < BOOTSTRAP_TIMEOUT_S + 1.5
    assert _stats(decode)["kv_claims_waiting"] == 0 and _stats(decode)["started"] == 0


def test_role_both_is_unchanged() -> None:
    server = start_mock_engine(model="m")
    try:
        body = {"prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": {"do_remote_prefill": True}}
        answer = httpx.post(f"{server.url}/v1/completions", json=body | {"bootstrap_room": "x"}, timeout=10)
        assert answer.status_code == 200 and "kv_transfer_params" not in answer.json()
        assert httpx.get(f"{server.url}/get_server_info").status_code == 404
        assert httpx.post(f"{server.url}/mock/kv/claim", json={}).status_code == 404
        assert "kv_transfers_pending" not in _stats(server)
    finally:
        server.stop()
