"""The floor proxy (bench/reference_asgi_proxy.py, a process under uvicorn) passes requests through
unchanged, relays streams chunk by chunk, and answers 502 when its upstream is gone; several
`bench overhead` runs summarize into medians and ranges of each server and ratio
(bench/overhead_runs.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.cpu_per_request import floor_proxy
from bench.overhead_runs import summarize
from tests.servers import ServerThread

MODEL = "test-model"


@pytest.fixture
def floor(mock_engines: Callable[..., ServerThread], tmp_path: Path) -> Iterator[str]:
    engine = mock_engines(model=MODEL, first_token_delay_ms=0, token_delay_ms=0)
    with floor_proxy(engine.url, tmp_path) as target:
        yield target.url


def test_an_upstream_that_is_gone_is_a_502(mock_engines: Callable[..., ServerThread], tmp_path: Path) -> None:
    engine = mock_engines(model=MODEL, first_token_delay_ms=0, token_delay_ms=0)
    with floor_proxy(engine.url, tmp_path) as target:
        engine.stop()
        r = httpx.get(f"{target.url}/health")
    assert r.status_code == 502 and "upstream" in r.json()["error"]["message"]


def test_a_non_streamed_answer_and_an_error_status_are_passed_through(floor: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = httpx.post(f"{floor}/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.headers["content-length"] == str(len(r.content))
    assert r.json()["usage"]["completion_tokens"] == 4 and r.json()["model"] == MODEL
    assert httpx.get(f"{floor}/v1/models").json()["data"][0]["id"] == MODEL
    bad = httpx.post(f"{floor}/v1/chat/completions", json={"model": MODEL, "messages": "not a list"})
    assert bad.status_code >= 400


def test_a_stream_is_relayed_to_its_end(floor: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}
    r = httpx.post(f"{floor}/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    content = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert len([c for c in content if c]) == 5


def _run(gateway_us: float, floor_us: float | None, reference_us: float) -> dict[str, Any]:
    def cpu(us: float) -> dict[str, float]:
        return {"stat_us": us, "schedstat_us": us}

    phase = {
        "gateway_cpu_us_per_request": [cpu(gateway_us)],
        "reference_cpu_us_per_request": [cpu(reference_us)],
    }
    if floor_us is not None:
        phase["floor_cpu_us_per_request"] = [cpu(floor_us)]
    return {"throughput": phase}


def test_runs_summarize_into_medians_and_ranges_with_ratios_taken_within_each_run() -> None:
    text = summarize([_run(600, 200, 100), _run(900, 300, 300), _run(660, None, 110)])
    row = next(line for line in text.splitlines() if "non-streamed request, closed loop" in line)
    cells = [c.strip() for c in row.split("|")[2:-1]]
    assert cells[0] == "660 [600–900]"
    assert cells[1] == "250 [200–300]"  # the run without a floor is left out of its cells
    assert cells[3] == "3.00 [3.00–3.00]"  # gateway ÷ floor per run: 3.0 and 3.0
    assert cells[4] == "1.50 [1.00–2.00]"
    assert cells[5] == "6.00 [3.00–6.00]"
    stream = next(line for line in text.splitlines() if "per stream, closed loop" in line)
    assert [c.strip() for c in stream.split("|")[2:-1]] == ["–"] * 6  # no run has it
