"""The pooling endpoints through a real gateway in front of real mock engines: passed through with
routing and admission, and refused with a 404 naming the pool when its engine does not serve them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.integration.conftest import MODEL, Fleet, pool
from tests.servers import ServerThread, gateway_settings, wait_until

DOCUMENTS = ["blue sky", "a red apple pie", "apple"]


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=10)


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_rerank_passes_through_both_paths_to_a_replica(fleet: Fleet, path: str) -> None:
    with _client(fleet.gateway.url) as client:
        response = client.post(path, json={"model": MODEL, "query": "red apple", "documents": DOCUMENTS})
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-replica"] in fleet.inflight()
    results = response.json()["results"]
    # the mock scores the share of the query's words a document holds: 1.0, 0.5, 0.0
    assert [r["index"] for r in results] == [1, 2, 0]
    assert results[0]["document"]["text"] == "a red apple pie"
    assert wait_until(lambda: set(fleet.inflight().values()) == {0}), "in-flight back to zero"


def test_score_pooling_and_classify_pass_through(fleet: Fleet) -> None:
    with _client(fleet.gateway.url) as client:
        score = client.post("/v1/score", json={"model": MODEL, "text_1": "red apple", "text_2": DOCUMENTS})
        pooled = client.post("/pooling", json={"model": MODEL, "input": ["a", "bb"]})
        classified = client.post("/classify", json={"model": MODEL, "input": "good"})
    assert [r.status_code for r in (score, pooled, classified)] == [200, 200, 200]
    scores = [d["score"] for d in score.json()["data"]]
    assert scores[1] > scores[2] > scores[0]
    assert [len(d["data"]) for d in pooled.json()["data"]] == [8, 8]
    probs = classified.json()["data"][0]["probs"]
    assert abs(sum(probs) - 1) < 1e-6
    assert wait_until(lambda: set(fleet.inflight().values()) == {0}), "in-flight back to zero"


def test_rerank_without_documents_is_refused_by_the_gateway(fleet: Fleet) -> None:
    with _client(fleet.gateway.url) as client:
        response = client.post("/v1/rerank", json={"model": MODEL, "query": "q"})
    assert response.status_code == 400
    assert response.headers["x-gateway-reject-reason"] == "bad_request"
    assert "'documents' is required" in response.json()["error"]["message"]


@pytest.fixture
def restricted(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]
) -> ServerThread:
    """`sglang-model` (engine sglang: its default endpoints) and `chat-only` (`endpoints: [chat]`)."""
    sglang, chat_only = mock_engines(model="a"), mock_engines(model="b")
    pools = [
        {**pool([sglang], engine="sglang"), "model": "sglang-model"},
        {**pool([chat_only], endpoints=["chat"]), "model": "chat-only"},
    ]
    return gateways(gateway_settings(pools))


@pytest.mark.parametrize(
    ("model", "path", "body"),
    [
        ("sglang-model", "/v1/score", {"text_1": "a", "text_2": "b"}),
        ("sglang-model", "/classify", {"input": "a"}),
        ("chat-only", "/v1/embeddings", {"input": "a"}),
        ("chat-only", "/rerank", {"query": "a", "documents": ["b"]}),
    ],
)
def test_an_endpoint_the_pool_does_not_serve_is_a_404_naming_the_pool(
    restricted: ServerThread, model: str, path: str, body: dict[str, Any]
) -> None:
    with _client(restricted.url) as client:
        response = client.post(path, json={"model": model, **body})
    assert response.status_code == 404
    assert response.headers["x-gateway-reject-reason"] == "endpoint_not_served"
    error = response.json()["error"]
    assert error["code"] == "endpoint_not_served" and error["type"] == "invalid_request_error"
    assert f"pool {model!r} does not serve {path}" in error["message"]
    assert "x-gateway-replica" not in response.headers, "nothing was sent to a replica"


def test_a_pool_serves_what_its_engine_flavour_serves_by_default(restricted: ServerThread) -> None:
    with _client(restricted.url) as client:
        rerank = client.post("/v1/rerank", json={"model": "sglang-model", "query": "a", "documents": ["a"]})
        chat = client.post(
            "/v1/chat/completions",
            json={"model": "chat-only", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
    assert rerank.status_code == 200 and chat.status_code == 200
