"""What a disaggregated mock replica reads from a request body: the wire fields of vLLM and SGLang.

vLLM (NixlConnector, pull model; read at vllm-project/vllm 002a1057, `nixl_connector.py`, and the proxy
`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py` at 030ea52e):

- prefill leg: `kv_transfer_params: {"do_remote_decode": true, ...}`, `stream: false`, `max_tokens: 1`.
  The answer's top-level `kv_transfer_params` (`do_remote_prefill: true, do_remote_decode: false,
  remote_engine_id, remote_request_id, remote_block_ids, remote_host, remote_port, tp_size`) go unchanged
  into the decode leg.
- decode leg: the original body (streamed or not, original max_tokens) + those `kv_transfer_params`.

SGLang (bootstrap; read at sgl-project/sglang 001c2ae0 `python/sglang/srt/disaggregation/mini_lb.py`
and 0105f2a3 `sgl-router/src/routers/http/pd_router.rs`): the same body, with `bootstrap_host` (the
prefill's host), `bootstrap_port` (its bootstrap port) and `bootstrap_room` (random in [0, 2⁶³ − 1]),
goes to the chosen prefill and decode replicas at once.

Every check raises `RequestError` (a 400 naming the field). Checks are stricter than the engines (which
fall back to a local prefill or ignore a malformed field) so that a gateway bug shows as a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from mock_engine.validation import RequestError

MAX_ROOM = 2**63 - 1
MAX_PORT = 65535


class Role(StrEnum):
    BOTH = "both"
    PREFILL = "prefill"
    DECODE = "decode"


class Protocol(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


@dataclass(frozen=True, slots=True)
class VllmPull:
    """A vLLM decode leg's transfer parameters: where to pull the prompt's KV from."""

    remote_engine_id: str
    remote_request_id: str
    remote_block_ids: tuple[int, ...]
    remote_host: str
    remote_port: int


@dataclass(frozen=True, slots=True)
class SglangBootstrap:
    """An SGLang leg's bootstrap fields: the prefill's bootstrap server and the room of this request."""

    host: str
    port: int
    room: int


def _params(body: dict[str, Any]) -> dict[str, Any]:
    params = body.get("kv_transfer_params")
    if not isinstance(params, dict):
        raise RequestError("kv_transfer_params must be an object (a disaggregated leg)", "kv_transfer_params")
    return params


def _flag(params: dict[str, Any], name: str) -> bool:
    value = params.get(name, False)
    if not isinstance(value, bool):
        raise RequestError(f"kv_transfer_params.{name} must be a boolean", "kv_transfer_params")
    return value


def _text(source: dict[str, Any], name: str, param: str, label: str) -> str:
    value = source.get(name)
    if not isinstance(value, str) or not value:
        raise RequestError(f"{label} must be a non-empty string, got {value!r}", param)
    return value


def _whole(source: dict[str, Any], name: str, param: str, label: str, *, low: int, high: int) -> int:
    value = source.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{label} must be an integer in [{low}, {high}], got {value!r}", param)
    return value


def vllm_prefill_leg(body: dict[str, Any]) -> None:
    """A vLLM prefill leg: `kv_transfer_params.do_remote_decode` true, not streamed, max_tokens set."""
    params = _params(body)
    if not _flag(params, "do_remote_decode") or _flag(params, "do_remote_prefill"):
        raise RequestError(
            "a prefill replica serves prefill legs only: kv_transfer_params.do_remote_decode must be true "
            "(and do_remote_prefill false)",
            "kv_transfer_params",
        )
    if body.get("stream"):
        raise RequestError("a prefill leg is not streamed: its kv_transfer_params come in the body", "stream")
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        raise RequestError("a prefill leg sets max_tokens (the proxy sends 1)", "max_tokens")


def vllm_decode_leg(body: dict[str, Any]) -> VllmPull:
    """A vLLM decode leg: the prefill answer's `kv_transfer_params`, with `do_remote_prefill` true."""
    params = _params(body)
    param = "kv_transfer_params"
    if not _flag(params, "do_remote_prefill") or _flag(params, "do_remote_decode"):
        raise RequestError(
            "a decode replica needs kv_transfer_params from a prefill answer (do_remote_prefill: true)", param
        )
    blocks = params.get("remote_block_ids")
    if not isinstance(blocks, list) or any(isinstance(b, bool) or not isinstance(b, int) for b in blocks):
        raise RequestError("kv_transfer_params.remote_block_ids must be a list of integers", param)
    return VllmPull(
        remote_engine_id=_text(params, "remote_engine_id", param, "kv_transfer_params.remote_engine_id"),
        remote_request_id=_text(params, "remote_request_id", param, "kv_transfer_params.remote_request_id"),
        remote_block_ids=tuple(blocks),
        remote_host=_text(params, "remote_host", param, "kv_transfer_params.remote_host"),
        remote_port=_whole(
            params, "remote_port", param, "kv_transfer_params.remote_port", low=1, high=MAX_PORT
        ),
    )


def sglang_leg(body: dict[str, Any]) -> SglangBootstrap:
    """Either SGLang leg: `bootstrap_host`, `bootstrap_port` and `bootstrap_room`, all three, scalars."""
    return SglangBootstrap(
        host=_text(body, "bootstrap_host", "bootstrap_host", "bootstrap_host"),
        port=_whole(body, "bootstrap_port", "bootstrap_port", "bootstrap_port", low=1, high=MAX_PORT),
        room=_whole(body, "bootstrap_room", "bootstrap_room", "bootstrap_room", low=0, high=MAX_ROOM),
    )
