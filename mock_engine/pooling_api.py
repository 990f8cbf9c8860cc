"""The pooling endpoints of the mock engine, vLLM-shaped, with deterministic scores (no generation, no
engine time; the fault plan applies as to embeddings).

- `POST /v1/rerank` and `/rerank`: `{query, documents: [str], top_n?}` → `results` sorted by
  `relevance_score` (descending, ties by index), each `{index, document: {text}, relevance_score}`;
- `POST /v1/score`: `{text_1: str | [str], text_2: str | [str]}` → `data: [{index, object: "score",
  score}]` (one text_1 against each text_2, or pairwise when both are lists of the same length);
- `POST /pooling`: `{input}` → `data: [{index, object: "pooling", data: [8 floats]}]`;
- `POST /classify`: `{input}` → `data: [{index, label, probs: [p, 1 - p], num_classes: 2}]`.

`relevance(a, b)` = the share of b's distinct lower-case words found in a, plus (prompt_seed(a + b)
mod 1000) / 10^6 to break ties: a document sharing more of the query's words ranks higher, and the
same pair always scores the same. Usage counts every text with the documented token estimate.
A missing or mistyped field is a 400 naming it; a `model` the engine does not serve, a 404 (`served_models`).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import orjson

from mock_engine.asgi import Receive, Scope, Send, respond
from mock_engine.text import estimate_tokens, prompt_seed
from mock_engine.validation import RequestError, prompt_texts

if TYPE_CHECKING:
    from mock_engine.server import MockEngineApp

POOLING_DIM = 8
LABELS = ("negative", "positive")


def relevance(query: str, document: str) -> float:
    """The deterministic score of `document` for `query` (module docstring), in [0, 1.001)."""
    words = set(query.lower().split())
    found = set(document.lower().split())
    share = len(words & found) / len(words) if words else 0.0
    return round(share + (prompt_seed(query + document) % 1000) / 1e6, 6)


def _texts(body: dict[str, Any], name: str) -> list[str]:
    value = body.get(name)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise RequestError(f"{name} must be a string or an array of strings", name)


def _usage(texts: list[str]) -> dict[str, int]:
    tokens = sum(estimate_tokens(t) for t in texts)
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def rerank(body: dict[str, Any], model: str) -> dict[str, Any]:
    query = body.get("query")
    if not isinstance(query, str):
        raise RequestError("query must be a string", "query")
    documents = _texts(body, "documents")
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
        raise RequestError("top_n must be a non-negative integer", "top_n")
    order = sorted(range(len(documents)), key=lambda i: (-relevance(query, documents[i]), i))
    scored = [
        {"index": i, "document": {"text": documents[i]}, "relevance_score": relevance(query, documents[i])}
        for i in order
    ]
    results = scored[:top_n] if top_n else scored
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": model,
        "usage": _usage([query, *documents]),
        "results": results,
    }


def score(body: dict[str, Any], model: str) -> dict[str, Any]:
    first, second = _texts(body, "text_1"), _texts(body, "text_2")
    if len(first) == 1:
        pairs = [(first[0], text) for text in second]
    elif len(first) == len(second):
        pairs = list(zip(first, second, strict=True))
    else:
        raise RequestError("text_1 must be one text or as many texts as text_2", "text_1")
    data = [{"index": i, "object": "score", "score": relevance(a, b)} for i, (a, b) in enumerate(pairs)]
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "model": model,
        "data": data,
        "usage": _usage(first + second),
    }


def pooling(body: dict[str, Any], model: str) -> dict[str, Any]:
    inputs = prompt_texts(body.get("input"), "input")
    data = []
    for i, text in enumerate(inputs):
        seed = prompt_seed(text)
        vector = [((seed >> (4 * k)) & 0xF) / 15.0 for k in range(POOLING_DIM)]
        data.append({"index": i, "object": "pooling", "data": vector})
    return {
        "id": f"pool-{uuid.uuid4().hex}",
        "object": "list",
        "model": model,
        "data": data,
        "usage": _usage(inputs),
    }


def classify(body: dict[str, Any], model: str) -> dict[str, Any]:
    inputs = prompt_texts(body.get("input"), "input")
    data = []
    for i, text in enumerate(inputs):
        positive = round((prompt_seed(text) % 1000) / 1000, 3)
        probs = [round(1 - positive, 3), positive]
        data.append({"index": i, "label": LABELS[positive >= 0.5], "probs": probs, "num_classes": 2})
    return {
        "id": f"classify-{uuid.uuid4().hex}",
        "object": "list",
        "model": model,
        "data": data,
        "usage": _usage(inputs),
    }


ANSWERS = {
    "/v1/rerank": rerank,
    "/rerank": rerank,
    "/v1/score": score,
    "/pooling": pooling,
    "/classify": classify,
}


def pooling_routes(app: MockEngineApp) -> dict[tuple[str, str], Any]:
    """The server's routes for the pooling endpoints."""

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        answer = ANSWERS[scope["path"]]
        result = await app.parse(receive, send, answer)
        if result is not None:
            await respond(send, 200, orjson.dumps(result))

    return {("POST", path): handle for path in ANSWERS}
