"""The request bodies of a disaggregated pool's two legs, as the engines define them, and what the
gateway reads back (field names and the engine versions read: docs/MOCK_ENGINE.md, "Disaggregated
serving protocols").

vLLM (NixlConnector, pull; the shape of vLLM's own disaggregated-serving proxy):
- prefill leg: the client's body with `kv_transfer_params = {do_remote_decode: true, do_remote_prefill:
  false, remote_engine_id/remote_block_ids/remote_host/remote_port: null}`, `stream: false`,
  `max_tokens: 1` (and `max_completion_tokens: 1` when the client sent that field), without
  `stream_options` and `min_tokens`;
- its answer's top-level `kv_transfer_params` (an object; anything else is a broken answer of the
  prefill replica, `UpstreamProtocolError`) go unchanged into the decode leg: the client's body (its
  own `stream`, `max_tokens`, `stream_options`) plus those params.

SGLang (bootstrap): the client's body plus `bootstrap_host` (the prefill replica URL's host),
`bootstrap_port` (`disaggregation.sglang.bootstrap_port`, else the replica's own answer in
`GET /get_server_info`: `disaggregation_bootstrap_port`, asked once per replica and remembered) and
`bootstrap_room` (uniform in [0, 2⁶³ − 1] from the injected RNG), sent to both replicas at once.

Both legs carry the same `x-request-id` (the request's; vLLM's proxy does the same).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from gateway.base.errors import UpstreamConnectError, UpstreamProtocolError
from gateway.upstream.replica import Replica

EMPTY_PULL = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
ROOM_BITS = 63
SERVER_INFO_PATH = "/get_server_info"


def vllm_prefill_body(base: dict[str, Any]) -> bytes:
    """The vLLM prefill leg (module docstring); `base` is the body the pool sends upstream."""
    body = {k: v for k, v in base.items() if k not in ("stream_options", "min_tokens")}
    body["kv_transfer_params"] = dict(EMPTY_PULL)
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    return orjson.dumps(body)


def vllm_decode_body(base: dict[str, Any], params: dict[str, Any]) -> bytes:
    """The vLLM decode leg: the upstream body plus the prefill answer's `kv_transfer_params`."""
    return orjson.dumps({**base, "kv_transfer_params": params})


def kv_transfer_params(answer: bytes, replica_id: str) -> dict[str, Any]:
    """The `kv_transfer_params` object of a vLLM prefill answer; `UpstreamProtocolError` (the prefill
    replica's failure) when the answer is not JSON or has none."""
    try:
        data = orjson.loads(answer)
    except orjson.JSONDecodeError:
        data = None
    params = data.get("kv_transfer_params") if isinstance(data, dict) else None
    if not isinstance(params, dict):
        raise UpstreamProtocolError(
            f"prefill replica {replica_id} answered without kv_transfer_params (is it a vLLM prefill "
            "instance with a KV connector?)",
            replica_id=replica_id,
        )
    return params


def sglang_body(base: dict[str, Any], host: str, port: int | None, room: int) -> bytes:
    """Either SGLang leg: the upstream body plus the three bootstrap fields."""
    return orjson.dumps({**base, "bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room})


def bootstrap_host(replica: Replica) -> str:
    """The prefill replica's host, as SGLang's routers take it (the hostname of its URL)."""
    return urlsplit(replica.url).hostname or ""


class BootstrapPorts:
    """Each SGLang prefill replica's bootstrap port: the configured one, else asked once (module
    docstring). A replica that cannot say is an `UpstreamConnectError` of that replica (its prefill leg
    fails, another prefill replica is tried)."""

    def __init__(self, session: aiohttp.ClientSession, configured: int | None, timeout_s: float) -> None:
        self._session = session
        self._configured = configured
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._known: dict[str, int] = {}

    async def port_of(self, replica: Replica, headers: dict[str, str]) -> int:
        if self._configured is not None:
            return self._configured
        known = self._known.get(replica.url)
        if known is not None:
            return known
        rid = replica.replica_id
        try:
            async with self._session.get(
                replica.url + SERVER_INFO_PATH, headers=headers, timeout=self._timeout
            ) as response:
                info = await response.json(content_type=None) if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            info = None
        port = info.get("disaggregation_bootstrap_port") if isinstance(info, dict) else None
        if isinstance(port, bool) or not isinstance(port, int):
            unknown = f"prefill replica {rid} did not report its bootstrap port ({SERVER_INFO_PATH})"
            raise UpstreamConnectError(unknown, replica_id=rid)
        self._known[replica.url] = port
        return port
