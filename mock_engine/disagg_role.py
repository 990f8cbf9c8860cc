"""A mock replica's disaggregation role: prefill or decode legs of vLLM's or SGLang's protocol.

Per generation request (`MockEngineApp._generate`), in order:

1. `check(body)`: the leg's fields (`disagg_params`), a 400 naming the field when absent or malformed —
   before any fault draw, like every bad input.
2. `begin(fields, gen, scope)` once the request is admitted:
   - vLLM prefill: registers a transfer keyed by a fresh `remote_request_id` with ⌈P / block⌉ block ids;
     the non-streamed answer carries `kv_transfer_params` for the decode leg (`answer_params`).
   - SGLang prefill: registers the room; the leg generates one token (the prefill's first token), streamed
     or not as asked — the router discards this answer.
   - decode (both): claims the transfer from the prefill replica (`transfers.py`): vLLM at
     `remote_host:remote_port`, SGLang at `bootstrap_host:bootstrap_port`, polling until the room's prefill
     is done or `bootstrap_timeout_s` (wall seconds) passes. Then the request runs with
     `kv_transfer_s = link.transfer_s(P, kv_bytes_per_token)` (simulated seconds, in the engine core: KV
     allocated, no prefill compute, first token after the transfer).
3. `end(leg, ok)`: the prefill leg's transfer becomes `done` (ok) or `failed`.

Failures of `begin` (`LegError`, answered before anything is generated, not counted in `started`):
400 `BadRequestError` when the claim names nothing the prefill holds (`unknown` for vLLM, `mismatch`), or
the host:port is not a prefill replica of this protocol; 503 `ServiceUnavailableError` when the prefill
replica cannot be reached; 500 `KVTransferError` when the SGLang room failed or its prefill did not
complete within `bootstrap_timeout_s`. The KV is gone in every case: a gateway redoes the prefill.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from mock_engine import openai_format as fmt
from mock_engine.asgi import ClientGone, Receive, Scope, Send, read_body, respond
from mock_engine.disagg_params import (
    Protocol,
    Role,
    SglangBootstrap,
    VllmPull,
    sglang_leg,
    vllm_decode_leg,
    vllm_prefill_leg,
)
from mock_engine.generation import Generation
from mock_engine.physics.kv_link import DEFAULT_KV_LINK, KvLink
from mock_engine.transfers import DEFAULT_HOLD_S, TransferTable

CLAIM_PATH = "/mock/kv/claim"
POLL_S = 0.02
CLAIM_WAIT_S = 1.0


@dataclass(frozen=True, slots=True)
class DisaggConfig:
    """`role` both: no disaggregation (the default, today's behaviour). `advertise_host` None: the
    address the request came in on; `bootstrap_port` None: the HTTP port (the mock serves its bootstrap
    endpoint there)."""

    role: Role = Role.BOTH
    protocol: Protocol = Protocol.VLLM
    kv_bytes_per_token: int = 163_840
    link: KvLink = DEFAULT_KV_LINK
    block_size_tokens: int = 16
    engine_id: str = dataclasses.field(default_factory=lambda: str(uuid.uuid4()))
    advertise_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_timeout_s: float = 30.0
    hold_s: float = DEFAULT_HOLD_S


class LegError(Exception):
    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param

    def body(self) -> bytes:
        return fmt.error_body(str(self), self.status, self.kind, self.param)


@dataclass(frozen=True, slots=True)
class Leg:
    """One admitted leg: `key` of its transfer (prefill), the answer's `kv_transfer_params` (vLLM prefill)."""

    key: str | None = None
    answer_params: dict[str, Any] | None = None


Fields = VllmPull | SglangBootstrap | None


class DisaggRole:
    def __init__(self, config: DisaggConfig) -> None:
        self.config = config
        self.transfers = TransferTable(config.hold_s)
        self._next_block = 0
        self._client: httpx.AsyncClient | None = None
        self.claims_waiting = 0
        self.received_total = 0
        self.errors_total = 0

    def check(self, body: dict[str, Any]) -> Fields:
        """The leg's fields; raises `RequestError` (400)."""
        c = self.config
        if c.protocol is Protocol.SGLANG:
            return sglang_leg(body)
        if c.role is Role.PREFILL:
            vllm_prefill_leg(body)
            return None
        return vllm_decode_leg(body)

    async def begin(self, fields: Fields, gen: Generation, scope: Scope) -> tuple[Generation, Leg]:
        """Register (prefill) or claim (decode) this leg's transfer; raises `LegError`."""
        if self.config.role is Role.PREFILL:
            return self._begin_prefill(fields, gen, scope)
        try:
            self.claims_waiting += 1
            prompt_tokens = await self._claim(fields, gen)
        except LegError:
            self.errors_total += 1
            raise
        finally:
            self.claims_waiting -= 1
        self.received_total += 1
        kv_transfer_s = self.config.link.transfer_s(prompt_tokens, self.config.kv_bytes_per_token)
        return dataclasses.replace(gen, kv_transfer_s=kv_transfer_s), Leg()

    def end(self, leg: Leg, ok: bool) -> None:
        if leg.key is not None:
            self.transfers.finish(leg.key, ok)

    def stats(self) -> dict[str, int]:
        """Counters merged into GET /mock/stats."""
        return {
            "kv_transfers_pending": len(self.transfers),
            "kv_transfers_completed": self.transfers.completed_total,
            "kv_transfers_claimed": self.transfers.claimed_total,
            "kv_transfers_received": self.received_total,
            "kv_transfer_errors": self.errors_total,
            "kv_claims_waiting": self.claims_waiting,
        }

    def server_info(self, scope: Scope) -> bytes:
        """GET /get_server_info (SGLang's name): the role and, for a prefill, its bootstrap port."""
        c = self.config
        return orjson.dumps(
            {
                "disaggregation_mode": "null" if c.role is Role.BOTH else c.role.value,
                "disaggregation_protocol": c.protocol.value,
                "disaggregation_bootstrap_port": c.bootstrap_port or scope["server"][1],
                "kv_engine_id": c.engine_id,
            }
        )

    async def handle_claim(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /mock/kv/claim on a prefill replica: `{protocol, key, wait_s, prompt_tokens,
        engine_id?, block_ids?}` → `{status, prompt_tokens, message}` (statuses in `transfers.py`)."""
        try:
            claim = orjson.loads(await read_body(receive))
            if not isinstance(claim, dict):
                raise TypeError("the claim must be a JSON object")
            if claim.get("protocol") != self.config.protocol.value or self.config.role is not Role.PREFILL:
                await respond(send, 404, fmt.error_body("not a prefill replica of this protocol", 404))
                return
            key, prompt_tokens = str(claim["key"]), int(claim["prompt_tokens"])
            wait_s = min(max(float(claim.get("wait_s", 0.0)), 0.0), 30.0)
            blocks = claim.get("block_ids")
            block_ids = None if blocks is None else tuple(int(b) for b in blocks)
        except ClientGone:
            return
        except (KeyError, TypeError, ValueError, orjson.JSONDecodeError) as exc:
            await respond(send, 400, fmt.bad_request_body(f"bad claim: {exc!r}"))
            return
        engine_id = claim.get("engine_id")
        result: dict[str, Any]
        if engine_id is not None and engine_id != self.config.engine_id:
            result = {"status": "mismatch", "message": f"this prefill is engine {self.config.engine_id}"}
        else:
            outcome = await self.transfers.claim(key, wait_s, prompt_tokens, block_ids)
            result = {
                "status": outcome.status,
                "prompt_tokens": outcome.prompt_tokens,
                "message": outcome.message,
            }
        await respond(send, 200, orjson.dumps(result))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- prefill ----------------------------------------------------------------------------------

    def _begin_prefill(self, fields: Fields, gen: Generation, scope: Scope) -> tuple[Generation, Leg]:
        c = self.config
        if isinstance(fields, SglangBootstrap):
            key = str(fields.room)
            self.transfers.register(key, gen.prompt_tokens)
            return dataclasses.replace(gen, max_tokens=1, finish_reason="length"), Leg(key)
        count = -(-max(gen.prompt_tokens, 1) // c.block_size_tokens)
        blocks = tuple(range(self._next_block, self._next_block + count))
        self._next_block += count
        key = f"{gen.response_id}-{uuid.uuid4().hex[:8]}"
        self.transfers.register(key, gen.prompt_tokens, blocks)
        host, port = scope["server"] if scope.get("server") else ("127.0.0.1", 0)
        params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": c.engine_id,
            "remote_request_id": key,
            "remote_block_ids": list(blocks),
            "remote_host": c.advertise_host or host,
            "remote_port": port,
            "tp_size": 1,
        }
        return gen, Leg(key, params)

    # -- decode -----------------------------------------------------------------------------------

    async def _claim(self, fields: Fields, gen: Generation) -> int:
        """The prompt tokens of the claimed transfer; polls an SGLang room until done or the timeout."""
        c = self.config
        claim: dict[str, Any] = {"protocol": c.protocol.value, "prompt_tokens": gen.prompt_tokens}
        if isinstance(fields, VllmPull):
            url = f"http://{fields.remote_host}:{fields.remote_port}{CLAIM_PATH}"
            claim |= {
                "key": fields.remote_request_id,
                "engine_id": fields.remote_engine_id,
                "block_ids": list(fields.remote_block_ids),
            }
        elif isinstance(fields, SglangBootstrap):
            url = f"http://{fields.host}:{fields.port}{CLAIM_PATH}"
            claim["key"] = str(fields.room)
        else:  # pragma: no cover - check() always returns fields for a decode
            raise LegError(400, "no transfer fields", "BadRequestError")
        deadline_s = time.monotonic() + c.bootstrap_timeout_s
        while True:
            remaining_s = deadline_s - time.monotonic()
            answer = await self._post(url, claim | {"wait_s": max(0.0, min(CLAIM_WAIT_S, remaining_s))})
            status, message = answer.get("status"), str(answer.get("message", ""))
            if status == "done":
                return int(answer["prompt_tokens"])
            if status == "mismatch" or (c.protocol is Protocol.VLLM and status in ("unknown", "failed")):
                raise LegError(400, f"invalid kv transfer: {message}", "BadRequestError", _param(c))
            if status == "failed":
                raise LegError(500, f"KV transfer failed: {message}", "KVTransferError")
            if time.monotonic() >= deadline_s:
                raise LegError(
                    500,
                    f"KV transfer timed out after {c.bootstrap_timeout_s:g} s waiting for the prefill "
                    f"({message})",
                    "KVTransferError",
                )
            if status == "unknown":
                await asyncio.sleep(POLL_S)

    async def _post(self, url: str, claim: dict[str, Any]) -> dict[str, Any]:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(CLAIM_WAIT_S + 5.0))
        try:
            response = await self._client.post(url, content=orjson.dumps(claim))
        except httpx.HTTPError as exc:
            raise LegError(
                503, f"prefill replica {url} unreachable: {exc!r}", "ServiceUnavailableError"
            ) from exc
        if response.status_code == 404:
            raise LegError(
                400,
                f"{url} is not a {self.config.protocol} prefill replica",
                "BadRequestError",
                _param(self.config),
            )
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if response.status_code != 200 or not isinstance(answer, dict):
            raise LegError(
                503, f"prefill replica {url} answered {response.status_code}", "ServiceUnavailableError"
            )
        return answer


def _param(config: DisaggConfig) -> str:
    return "kv_transfer_params" if config.protocol is Protocol.VLLM else "bootstrap_room"
