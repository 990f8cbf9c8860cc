"""The mock engine's endpoints that answer from the text alone (no generation, no engine time; the fault
plan applies): `POST /v1/embeddings`, `/tokenize`, `/detokenize`.

- embeddings: one `EMBEDDING_DIM`-float vector per input, the nibbles of `prompt_seed(text)` scaled to
  [0, 1] (the same text always embeds the same); usage counts every input with the token estimate;
- tokenize: one "token" per fourth character (its code point), with `count` and `max_model_len` 8192;
- detokenize: the characters of the given code points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from mock_engine.asgi import Receive, Scope, Send, respond
from mock_engine.text import estimate_tokens, prompt_seed
from mock_engine.validation import detokenize_tokens, prompt_texts, tokenize_prompt

if TYPE_CHECKING:
    from mock_engine.server import MockEngineApp

EMBEDDING_DIM = 8


def text_routes(app: MockEngineApp) -> dict[tuple[str, str], Any]:
    """The server's routes for the text endpoints."""

    async def embeddings(scope: Scope, receive: Receive, send: Send) -> None:
        parsed: tuple[list[str], str] | None = await app.parse(
            receive, send, lambda body, model: (prompt_texts(body.get("input"), "input"), model)
        )
        if parsed is None:
            return
        inputs, model = parsed
        data = []
        for i, text in enumerate(inputs):
            seed = prompt_seed(text)
            vector = [((seed >> (4 * k)) & 0xF) / 15.0 for k in range(EMBEDDING_DIM)]
            data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = sum(estimate_tokens(t) for t in inputs)
        out = {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        await respond(send, 200, orjson.dumps(out))

    async def tokenize(scope: Scope, receive: Receive, send: Send) -> None:
        text: str | None = await app.parse(receive, send, lambda body, _: tokenize_prompt(body))
        if text is not None:
            tokens = [ord(ch) for ch in text[::4]]
            await respond(
                send, 200, orjson.dumps({"tokens": tokens, "count": len(tokens), "max_model_len": 8192})
            )

    async def detokenize(scope: Scope, receive: Receive, send: Send) -> None:
        tokens: list[int] | None = await app.parse(receive, send, lambda body, _: detokenize_tokens(body))
        if tokens is not None:
            await respond(send, 200, orjson.dumps({"prompt": "".join(chr(t) for t in tokens)}))

    return {
        ("POST", "/v1/embeddings"): embeddings,
        ("POST", "/tokenize"): tokenize,
        ("POST", "/detokenize"): detokenize,
    }
