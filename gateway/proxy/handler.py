"""The proxy endpoint: parse → route → open upstream (with retries) → relay → account, for every outcome.

Every request ends in exactly one of: a relayed response, a contract error response (before the first
byte), or a terminal SSE error event (after it). Whatever happens — including the client leaving and
bugs — `Exchange.release()` runs in `finally`, so in-flight counts return to zero.
"""

from __future__ import annotations

import logging
import uuid

import httpx

from gateway.api.asgi_io import (
    ClientDisconnected,
    DisconnectWatcher,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_response,
)
from gateway.api.request_parsing import Endpoint, ParsedRequest, parse_request, rewrite_body
from gateway.error_mapping import to_response, to_sse_event
from gateway.errors import Draining, GatewayError, InternalError, ModelNotFound
from gateway.metrics import GatewayMetrics
from gateway.proxy.attempts import UpstreamOpener, forwarded_headers
from gateway.proxy.exchange import Exchange
from gateway.proxy.relay import SSE_CONTENT_TYPE, StreamRelay, finish_body, relay_full
from gateway.settings import Settings
from gateway.upstream.registry import Pool, ReplicaRegistry
from router.keys import build_routing_request, session_key_of

logger = logging.getLogger(__name__)

OUTCOME_SUCCESS = "success"
OUTCOME_CLIENT_DISCONNECT = "client_disconnect"
UNKNOWN_MODEL_LABEL = "unknown"


class ProxyHandler:
    """Serves the OpenAI endpoints for one app instance."""

    def __init__(
        self,
        settings: Settings,
        registry: ReplicaRegistry,
        client: httpx.AsyncClient,
        metrics: GatewayMetrics,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._metrics = metrics
        self._opener = UpstreamOpener(client, registry, metrics)
        self.draining = False

    async def __call__(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = Exchange(request_id=header(scope, b"x-request-id") or uuid.uuid4().hex, send=send)
        outcome = OUTCOME_SUCCESS
        try:
            if self.draining:
                raise Draining(
                    "the gateway is shutting down", retry_after_s=self._settings.server.drain_timeout_s
                )
            raw = await read_body(receive, self._settings.server.max_body_bytes)
            exchange.parsed = parse_request(endpoint, raw)
            exchange.pool = self._registry.pool(exchange.parsed.model)
            if exchange.pool is None:
                raise ModelNotFound(f"the model {exchange.parsed.model!r} does not exist")
            async with DisconnectWatcher(receive) as watcher:
                exchange.watcher = watcher
                await self._serve(exchange, exchange.parsed, exchange.pool, scope)
            if watcher.disconnected:
                outcome = OUTCOME_CLIENT_DISCONNECT
        except ClientDisconnected:
            outcome = OUTCOME_CLIENT_DISCONNECT
        except GatewayError as error:
            outcome = str(error.code)
            await self._answer_error(exchange, error)
        except Exception as exc:
            logger.exception("unhandled error in request %s", exchange.request_id)
            internal = InternalError(f"internal gateway error: {type(exc).__name__}")
            outcome = str(internal.code)
            await self._answer_error(exchange, internal)
        finally:
            self._account(exchange, outcome)

    async def _serve(self, exchange: Exchange, parsed: ParsedRequest, pool: Pool, scope: Scope) -> None:
        routing = build_routing_request(
            parsed.model,
            parsed.prompt_text,
            pool.key_settings,
            session_key=session_key_of(header(scope, b"x-session-id"), parsed.user),
            estimated_prompt_tokens=parsed.estimated_prompt_tokens,
            max_tokens=parsed.max_tokens,
        )
        body = rewrite_body(parsed, pool.settings.upstream_model)
        headers = forwarded_headers(scope["headers"], exchange.request_id)
        timeouts = pool.settings.timeouts
        try:
            await self._opener.open(exchange, pool, routing, body, headers)
            assert exchange.response is not None
            is_sse = exchange.response.headers.get("content-type", "").startswith(SSE_CONTENT_TYPE)
            if parsed.stream and is_sse:
                await StreamRelay(exchange, timeouts.ttft_s, timeouts.total_s).run()
            else:
                await relay_full(exchange, timeouts.nonstream_s)
        finally:
            await exchange.release()

    async def _answer_error(self, exchange: Exchange, error: GatewayError) -> None:
        self._metrics.rejections_total.labels(str(error.code)).inc()
        if exchange.response_started:
            await finish_body(exchange, to_sse_event(error))
            return
        answer = to_response(error)
        headers = [*answer.headers, ("x-request-id", exchange.request_id)]
        if exchange.decision is not None:
            headers.append(("x-gateway-replica", exchange.decision.replica_id))
        await send_response(exchange.send, answer.status, headers, answer.body)

    def _account(self, exchange: Exchange, outcome: str) -> None:
        model = exchange.pool.model if exchange.pool is not None else UNKNOWN_MODEL_LABEL
        m = self._metrics
        m.requests_total.labels(model, outcome).inc()
        if exchange.pool is None:
            return
        elapsed_s = exchange.elapsed_s()
        m.request_duration_seconds.labels(model).observe(elapsed_s)
        if outcome != OUTCOME_SUCCESS or exchange.ttft_s is None:
            return
        m.ttft_seconds.labels(model).observe(exchange.ttft_s)
        usage = exchange.usage or {}
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
        if isinstance(prompt_tokens, int):
            m.tokens_total.labels("input").inc(prompt_tokens)
        if isinstance(completion_tokens, int):
            m.tokens_total.labels("output").inc(completion_tokens)
            if completion_tokens > 1 and exchange.parsed is not None and exchange.parsed.stream:
                m.tpot_seconds.labels(model).observe((elapsed_s - exchange.ttft_s) / (completion_tokens - 1))
