"""After a stream has started (DESIGN §4): an error becomes one final SSE event `data: {"error": {...}}`
with `code` one of the documented reasons, and the stream ends — it never hangs and never silently
truncates. (`draining`'s terminal event is checked with the draining test in `test_error_contract.py`.)
"""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from tests.contract.conftest import (
    CHAT,
    CRASH,
    LONG,
    LONG_TOTAL_S,
    STALL,
    STALL_IDLE_S,
    ContractGateway,
    chat,
)

TERMINAL_CODES = {
    "upstream_idle_timeout",
    "upstream_protocol",
    "upstream_total_timeout",
    "draining",
    "internal_error",
}


@pytest.mark.parametrize(
    ("model", "code", "bound_s"),
    [
        (STALL, "upstream_idle_timeout", STALL_IDLE_S),  # the engine goes silent after 2 tokens
        (CRASH, "upstream_protocol", 0.0),  # the engine resets the connection after 2 tokens
        (LONG, "upstream_total_timeout", LONG_TOTAL_S),  # 200 tokens at 20 ms outlive total_s
    ],
)
def test_an_error_after_the_stream_started_is_one_final_sse_event(
    contract_gateway: ContractGateway, model: str, code: str, bound_s: float
) -> None:
    started = time.monotonic()
    with (
        httpx.Client(timeout=httpx.Timeout(5.0)) as client,
        client.stream(
            "POST", contract_gateway.url + CHAT, json=chat(model, stream=True, max_tokens=200)
        ) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    elapsed_s = time.monotonic() - started
    assert elapsed_s < bound_s + 2.0, "the stream ended by the deadline instead of hanging"
    assert all(event.startswith("data: ") for event in events), events
    payloads = [event.removeprefix("data: ") for event in events]
    assert "[DONE]" not in payloads, "an interrupted stream does not pretend it completed"
    chunks = [orjson.loads(p) for p in payloads]
    assert any(c.get("choices") and c["choices"][0]["delta"].get("content") for c in chunks[:-1]), (
        "content was streamed before the error"
    )
    *before, last = chunks
    assert all("error" not in c for c in before), "exactly one error event, the last one"
    assert set(last) == {"error"} and set(last["error"]) >= {"message", "type", "code"}
    assert last["error"]["code"] == code and code in TERMINAL_CODES
    assert last["error"]["message"] and last["error"]["type"]
