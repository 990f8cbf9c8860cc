"""What each engine flavour speaks: its name in the config, whether it continues a stream from a
trailing assistant message, and the endpoints it serves by default (a pool's `endpoints` overrides it).
"""

from __future__ import annotations

from typing import Literal

EngineFlavour = Literal["vllm", "sglang", "tgi", "llamacpp", "openai"]
CONTINUING_ENGINES = frozenset({"vllm", "sglang", "llamacpp"})
"""Flavours that continue a trailing assistant message (`continue_final_message`), so continuation is
on by default for them."""
ServedEndpoint = Literal[
    "chat", "completions", "embeddings", "tokenize", "detokenize",
    "rerank", "score", "pooling", "classify", "messages", "responses",
]  # fmt: skip
_OPENAI_BASE = frozenset({"chat", "completions", "embeddings", "tokenize", "detokenize"})
ENDPOINTS_BY_ENGINE: dict[str, frozenset[str]] = {
    "vllm": _OPENAI_BASE | {"rerank", "score", "pooling", "classify", "messages", "responses"},
    "sglang": _OPENAI_BASE | {"rerank"},
    "llamacpp": _OPENAI_BASE | {"rerank", "messages", "responses"},
    "tgi": _OPENAI_BASE,
    "openai": _OPENAI_BASE | {"responses"},
}
"""What each engine flavour serves by default (a pool's `endpoints` overrides it): vLLM every endpoint
(Messages since 0.11, Responses with its in-memory store, the pooling endpoints when the model is a
pooling one), SGLang and llama.cpp their rerank, llama.cpp Messages and Responses, TGI the OpenAI ones."""
