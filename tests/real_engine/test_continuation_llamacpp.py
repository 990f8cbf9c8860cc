"""Mid-stream continuation on real llama.cpp replicas (issue 14): a stream cut on one replica goes on
from the other, which continues the trailing assistant message; the client sees one stream."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.real_engine.conftest import MODEL, openai_client

pytestmark = pytest.mark.real_engine

ADMIN_KEY = "real-engine-admin"
TOKENS = 40


@pytest.mark.timeout(120)
def test_a_stream_cut_mid_way_completes_on_the_other_replica(real_gateway, monkeypatch) -> None:
    monkeypatch.setenv("LLM_GATEWAY_ADMIN_KEY", ADMIN_KEY)
    gateway = real_gateway("round-robin")
    client = openai_client(gateway)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        max_tokens=TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0,
        seed=1,
    )
    first_replica = stream.response.headers["x-gateway-replica"]
    chunks: list[Any] = []
    for chunk in stream:
        chunks.append(chunk)
        if sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) >= 8:
            break
    cut = httpx.post(
        f"{gateway.url}/admin/replicas/{first_replica}/preempt",
        json={"deadline_s": 0, "margin_s": 0},
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert cut.status_code == 200, cut.text
    chunks.extend(stream)
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len({c.id for c in chunks}) == 1, "one id for the whole stream"
    assert sum(bool(c.choices and c.choices[0].delta.role) for c in chunks) == 1, "one role chunk"
    assert len(usage) == 1 and usage[0].completion_tokens >= len(content) > 8, usage
    continued = gateway.app.state.metrics.stream_continuations_total.labels(MODEL)._value.get()
    assert continued == 1, "the stream was cut on its replica and continued on the other"
