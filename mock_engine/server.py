"""The mock engine's HTTP server: OpenAI-compatible endpoints over an `EngineCore` (plain ASGI).

Endpoints: POST /v1/chat/completions, /v1/completions; /v1/embeddings, /tokenize, /detokenize
(`text_endpoints.py`); the pooling endpoints (`pooling_api.py`); the Anthropic Messages API
(`anthropic_format.py`); the Responses API with its in-memory store (`responses_store.py`);
GET /v1/models, /health, /metrics (vLLM names), /mock/stats (counters tests read);
GET/POST/DELETE /mock/faults (fault settings: read, partial update, clear; `control.py`);
POST /v1/load_lora_adapter, /v1/unload_lora_adapter when runtime LoRA loading is on.
The models served (base names, LoRA adapters) and the model check every request reading `model` goes
through are `served_models.py`; an adapter's requests run in the core under that adapter (`core.py`).
Every API family runs its generations through `generation_runner.py` (counting, aborts); the generation
loop and the streamed format are in `streaming.py`; faults and their observable effects are
documented in `faults.py` and `docs/MOCK_ENGINE.md`. A client that disconnects aborts its request in the core
(counted in `aborted`), so the simulated GPU stops working on it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

import orjson

from mock_engine import openai_format as fmt
from mock_engine.anthropic_format import anthropic_routes
from mock_engine.asgi import (
    ClientGone,
    Receive,
    Scope,
    Send,
    read_body,
    respond,
)
from mock_engine.config import MockEngineConfig
from mock_engine.control import FaultControl
from mock_engine.core import EngineCore
from mock_engine.disagg_params import Role
from mock_engine.disagg_role import CLAIM_PATH, DisaggRole, Leg, LegError
from mock_engine.driver import EngineDriver
from mock_engine.faults import FaultPlan, FaultSettings
from mock_engine.generation import Generation
from mock_engine.generation_runner import GenerationRunner
from mock_engine.listeners import ListenerGate
from mock_engine.metrics_text import LoraRequestsInfo, render_metrics
from mock_engine.pooling_api import pooling_routes
from mock_engine.responses_store import ResponsesApi
from mock_engine.served_models import ServedModels, UnknownModel
from mock_engine.streaming import RequestCounters
from mock_engine.text_endpoints import text_routes
from mock_engine.validation import RequestError, common_fields

__all__ = ["MockEngineApp", "MockEngineConfig", "RequestCounters"]

Handler = Callable[[Scope, Receive, Send], Any]
Check = Callable[[dict[str, Any], str], Any]


class MockEngineApp:
    """The ASGI app. `faults` holds the fault settings (`faults.settings`) and applies changes."""

    def __init__(
        self,
        config: MockEngineConfig,
        core: EngineCore,
        faults: FaultSettings,
        seed: int = 0,
        listeners: ListenerGate | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock`: wall time (Unix seconds) for `created` fields and the LoRA metric. Raises ValueError
        for duplicate model or adapter names."""
        self.config = config
        core.max_loras = config.max_loras
        self.driver = EngineDriver(core, speed=config.speed)
        self.faults = FaultControl(faults, random.Random(seed), listeners)
        self.counters = RequestCounters()
        self.disagg = None if config.disagg.role is Role.BOTH else DisaggRole(config.disagg)
        self.models = ServedModels(
            (config.model, *config.model_aliases),
            config.lora_modules,
            root=config.model_root,
            runtime_loading=config.allow_runtime_lora,
            checking=config.check_model,
            max_adapters=config.max_adapters,
            max_model_len=config.max_context_tokens,
            clock=clock,
        )
        self.runner = GenerationRunner(
            self.driver,
            self.counters,
            self.disagg,
            model_name=self.models.answer_name,
            shutting_down=lambda: self.faults.gate.shutting_down,
        )
        self.lora_info = LoraRequestsInfo(config.max_loras) if self.models.lora_enabled else None
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): self._generate,
            ("POST", "/v1/completions"): self._generate,
        }
        if self.disagg is not None:
            self._routes[("POST", CLAIM_PATH)] = self.disagg.handle_claim
        if config.allow_runtime_lora:
            self._routes[("POST", "/v1/load_lora_adapter")] = self._lora_admin(self.models.load)
            self._routes[("POST", "/v1/unload_lora_adapter")] = self._lora_admin(self.models.unload)
        self.responses = ResponsesApi(self)
        self._routes |= (
            self.faults.routes() | pooling_routes(self) | anthropic_routes(self) | text_routes(self)
        )
        self._routes |= self.responses.routes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        route = (scope["method"], scope["path"])
        handler = self._routes.get(route) or self.responses.match(*route)
        if handler is not None:
            await handler(scope, receive, send)
            return
        simple: dict[tuple[str, str], Callable[[], tuple[bytes, str]]] = {
            ("GET", "/health"): lambda: (b"{}", "application/json"),
            ("GET", "/v1/models"): lambda: (self.models.list_body(), "application/json"),
            ("GET", "/metrics"): lambda: (self._metrics(), "text/plain"),
            ("GET", "/mock/stats"): self._stats,
        }
        if self.disagg is not None:
            disagg = self.disagg
            simple[("GET", "/get_server_info")] = lambda: (disagg.server_info(scope), "application/json")
        answer = simple.get(route)
        if answer is None:
            await respond(send, 404, fmt.error_body(f"no route {route[0]} {route[1]}", 404))
            return
        body, content_type = answer()
        await respond(send, 200, body, content_type)

    def set_faults_threadsafe(self, changes: Mapping[str, Any], timeout_s: float = 5.0) -> FaultSettings:
        """Change fault settings from another thread (e.g. a test) while the server runs; returns them.
        The only way back from `refuse_connections` without `refuse_for_s`, as the endpoint is unreachable."""
        if self._loop is None:
            raise RuntimeError("the mock engine is not running")
        if _running_loop() is self._loop:
            raise RuntimeError("set_faults_threadsafe is for other threads: await app.faults.update() here")
        future = asyncio.run_coroutine_threadsafe(self.faults.update(changes), self._loop)
        return future.result(timeout_s)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._loop = asyncio.get_running_loop()
                self.driver.start()
                self.faults.on_startup(self)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.faults.on_shutdown()
                await self.driver.stop()
                if self.disagg is not None:
                    await self.disagg.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _stats(self) -> tuple[bytes, str]:
        stats: dict[str, Any] = asdict(self.counters) | {"responses_stored": len(self.responses.store)}
        stats |= {
            "requests_by_model": self.models.requests_by_model,
            "unknown_model_refused": self.models.unknown_model_refused,
        }
        if self.disagg is not None:
            stats |= self.disagg.stats()
        return orjson.dumps(stats), "application/json"

    def _metrics(self) -> bytes:
        stats = self.driver.core.stats()
        wall_sum_s = stats.inter_token_latency_sum_s / self.driver.speed  # an engine reports real time
        stats = dataclasses.replace(stats, inter_token_latency_sum_s=wall_sum_s)
        if self.lora_info is not None:
            self.lora_info.sample(stats, self._clock())
        flavour = self.config.metrics_flavour
        return render_metrics(self.config.model, stats, flavour=flavour, lora=self.lora_info)

    def _lora_admin(self, action: Callable[[dict[str, Any]], tuple[int, bytes, str]]) -> Handler:
        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            body = await self.read_json(receive, send)
            if body is not None:
                status, answer, content_type = action(body)
                await respond(send, status, answer, content_type)

        return handle

    async def read_json(self, receive: Receive, send: Send) -> dict[str, Any] | None:
        """The JSON object body, or None once answered 400 (or the client left)."""
        try:
            body = orjson.loads(await read_body(receive))
        except ClientGone:
            return None
        except orjson.JSONDecodeError as exc:
            await respond(send, 400, fmt.bad_request_body(f"the body is not valid JSON: {exc}"))
            return None
        if not isinstance(body, dict):
            await respond(send, 400, fmt.bad_request_body("the body must be a JSON object"))
            return None
        return body

    async def fault_plan(self, send: Send, prompt: str | None = None) -> FaultPlan | None:
        """This request's fault plan (`prompt`: a generation's prompt text, checked for poison), or None
        once answered with an injected error."""
        plan = self.faults.plan(prompt)
        if plan.poisoned:
            self.counters.poisoned_injected += 1
        if plan.error_status is None:
            return plan
        self.counters.failed_injected += 1
        retry_after = plan.retry_after_header()
        headers = [(b"retry-after", retry_after.encode())] if retry_after is not None else []
        body = fmt.error_body(plan.error_message(), plan.error_status)
        await respond(send, plan.error_status, body, extra=headers)
        return None

    async def parse(self, receive: Receive, send: Send, check: Check) -> Any:
        """`check(body, model)` (which raises `RequestError` for bad input; `model` the name its answer
        carries) once this request's fault plan lets it run, or None once answered (bad body, a model not
        served, injected error). Bad input and a model not served are answered before the fault draw."""
        body = await self.read_json(receive, send)
        if body is None:
            return None
        try:
            common_fields(body)
            value = check(body, self.models.answer_name(self.models.resolve(body.get("model"))))
        except RequestError as exc:
            await respond(send, 400, fmt.bad_request_body(str(exc), exc.param))
            return None
        except UnknownModel as exc:
            await respond(send, 404, exc.body())
            return None
        plan = await self.fault_plan(send)
        return None if plan is None else value

    async def _generate(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self.read_json(receive, send)
        if body is None:
            return
        chat = scope["path"] == "/v1/chat/completions"
        try:
            gen = Generation.from_body(body, chat, self.config.default_max_tokens)
            gen = dataclasses.replace(gen, adapter=self.models.resolve(body.get("model")))
            fields = None if self.disagg is None else self.disagg.check(body)
        except RequestError as exc:
            await respond(send, 400, fmt.bad_request_body(str(exc), exc.param))
            return
        except UnknownModel as exc:
            await respond(send, 404, exc.body())
            return
        plan = await self.fault_plan(send, gen.prompt)
        if plan is None:
            return
        too_long = self.over_context(gen)
        if too_long is not None:
            await respond(send, 400, fmt.bad_request_body(too_long))
            return
        leg = Leg()
        if self.disagg is not None:
            try:
                gen, leg = await self.disagg.begin(fields, gen, scope)
            except LegError as exc:
                await respond(send, exc.status, exc.body())
                return
        answer = None if leg.answer_params is None else {"kv_transfer_params": leg.answer_params}
        await self.runner.run(
            gen, plan, receive, send, stream=bool(body.get("stream")), leg=leg, answer=answer
        )

    def over_context(self, gen: Generation) -> str | None:
        """Why `gen` exceeds the engine's context limit (a 400, as vLLM past max_model_len), or None."""
        limit = self.config.max_context_tokens
        if limit is not None and gen.prompt_tokens + gen.max_tokens > limit:
            return (
                f"prompt ({gen.prompt_tokens} tokens) + max_tokens ({gen.max_tokens}) exceeds {limit} tokens"
            )
        return None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
