"""The edge of the serve path: parse → authenticate → build the context → serve → answer errors → account.

Every request ends in exactly one of: a relayed response, a contract error response (before the first
byte), or a terminal SSE error event (after it). Whatever happens — the client leaving, a shutdown,
bugs — the serve path releases what it holds in `finally` (the admission ticket), so in-flight counts
return to zero; this handler then tells the event port the request `finished` (its metrics,
`gateway.proxy.account`; its span and access-log line, `gateway.observability`).

Order of the checks, and so of the answers: draining (503) → API key (401, before the body is read) →
body size (413; a declared length before any of the body is read) → body deadline (408) → JSON and
fields (400) → a stored response the gateway knows (Responses API: 404 `response_not_found`; an id
call's model is its record's) → model (404; aliases resolved, `gateway.upstream.model_catalog`) →
endpoint served by the pool (404 `endpoint_not_served`) → the stored response's replica routable (404
`response_state_lost`) → priority class and timer headers (400) → idempotent replay → admission
(429/503; a refusal may pass to the pool's fallback, `gateway.proxy.fallback`) → upstream. Each write
to the client has a deadline too (`gateway.api.asgi_io.ClientIO`).

Errors are rendered for the endpoint's API surface (`gateway.base.surface`: Anthropic-shaped on
`/v1/messages`) and answered by `gateway.proxy.error_answer`. The tenant key is `Authorization: Bearer
<key>`, or `x-api-key: <key>` (the Anthropic clients' header) when no `Authorization` is sent
(`gateway.api.tenant_key`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from admission.outcomes import AdmissionRefused, RejectReason
from admission.retry_after import draining_retry_after_s
from admission.tenants import AuthenticationFailed, Tenant, TenantDirectory
from core.clock import Clock, SystemClock
from gateway.api.asgi_io import (
    ClientDisconnected,
    ClientIO,
    DisconnectWatcher,
    Receive,
    Scope,
    Send,
    header,
)
from gateway.api.request_ids import request_id_of
from gateway.api.request_parsing import Endpoint, ParsedRequest, parse_request, parse_response_call
from gateway.api.response_calls import response_call
from gateway.api.tenant_key import tenant_authorization
from gateway.api.write_deadline import WriteDeadlines
from gateway.base.errors import (
    Draining,
    EndpointNotServed,
    GatewayError,
    InternalError,
    ModelNotFound,
    Unauthorized,
)
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import Settings
from gateway.observability.events import ServeEvents
from gateway.observability.request_record import RequestRecord
from gateway.proxy.account import OUTCOME_CLIENT_DISCONNECT, OUTCOME_SUCCESS
from gateway.proxy.adapter_loading import AdapterLoader
from gateway.proxy.admission_assembly import Admission
from gateway.proxy.context import RequestContext, build_context
from gateway.proxy.error_answer import ErrorAnswer
from gateway.proxy.fallback import Fallback
from gateway.proxy.idempotent_serving import IdempotentServing
from gateway.proxy.reply import Reply
from gateway.proxy.response_affinity import ResponseAffinity
from gateway.proxy.serving import RequestServer
from gateway.proxy.stores.idempotency import IdempotencyStore
from gateway.proxy.stores.response_state import ResponseLocation
from gateway.upstream.model_catalog import ModelCatalog, ServedModel

logger = logging.getLogger(__name__)

PRIORITY_HEADER = b"x-gateway-priority"


class ProxyHandler:
    """Serves the OpenAI endpoints for one app instance (its parts come from `gateway.composition`)."""

    def __init__(
        self,
        *,
        settings: Settings,
        catalog: ModelCatalog,
        adapters: AdapterLoader,
        tenants: TenantDirectory,
        admission: Admission,
        server: RequestServer,
        idempotency: IdempotencyStore,
        metrics: GatewayMetrics,
        events: ServeEvents,
        engine_keys: dict[str, str] | None = None,
        affinity: ResponseAffinity,
        clock: Clock | None = None,
    ) -> None:
        self._settings = settings
        self._catalog = catalog
        self._adapters = adapters
        self._fallback = Fallback(metrics)
        self._tenants = tenants
        self._admission = admission
        self._server = server
        self._idempotent = IdempotentServing(server, idempotency, tenants)
        self._engine_keys = engine_keys or {}
        self._affinity = affinity
        self._metrics = metrics
        self._events = events
        self._answer_error = ErrorAnswer(metrics, settings.server.readiness_propagation_s)
        self.draining = False
        self._active: dict[asyncio.Task[Any], Reply] = {}
        self._clock = clock or SystemClock()
        self._write_deadlines = WriteDeadlines(settings.server.write_timeout_s, self._clock)

    def start_drain(self) -> None:
        """Refuse new requests and everything still queued with 503 `draining`."""
        self.draining = True
        retry_after_s = draining_retry_after_s(self._settings.server.readiness_propagation_s)
        self._admission.reject_waiting(
            AdmissionRefused(RejectReason.DRAINING, retry_after_s, "the gateway is shutting down")
        )

    def abort_all(self, error: GatewayError) -> None:
        """End every request still running with `error` (shutdown after the drain timeout)."""
        for task, reply in self._active.items():
            reply.abort_error = error
            task.cancel()

    async def __call__(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        server_settings = self._settings.server
        client = ClientIO(
            scope,
            receive,
            send,
            deadlines=self._write_deadlines,
            on_timeout=lambda phase: self._metrics.client_timeouts_total.labels(phase).inc(),
        )
        send = client.send  # each write within the write deadline; a stalled reader ends the request
        reply = Reply(request_id=request_id_of(header(scope, b"x-request-id")), send=send, clock=self._clock)
        request_record = self._server.observe(scope, reply.request_id, endpoint.value)  # or a no-op
        outcome = OUTCOME_SUCCESS
        tenant: Tenant | None = None
        stream = False
        surface = endpoint.surface
        task = asyncio.current_task()
        assert task is not None
        self._active[task] = reply
        try:
            if self.draining:
                raise Draining("the gateway is shutting down")
            tenant = self._tenant(scope)
            raw = await client.read_body(server_settings.max_body_bytes, server_settings.body_timeout_s)
            parsed, stored = await self._parse(endpoint, scope, raw, tenant, request_record)
            stream = parsed.stream
            if await self._handle(endpoint, scope, receive, reply, tenant, parsed, stored, request_record):
                outcome = OUTCOME_CLIENT_DISCONNECT
        except ClientDisconnected:
            outcome = OUTCOME_CLIENT_DISCONNECT
        except asyncio.CancelledError:
            if reply.abort_error is None:
                raise
            task.uncancel()
            outcome = str(reply.abort_error.code)
            await self._answer_error(reply, reply.abort_error, surface)
        except GatewayError as error:
            outcome = str(error.code)
            await self._answer_error(reply, error, surface)
        except Exception as exc:
            logger.exception("unhandled error in request %s", reply.request_id)
            internal = InternalError(f"internal gateway error: {type(exc).__name__}")
            outcome = str(internal.code)
            await self._answer_error(reply, internal, surface)
        finally:
            del self._active[task]
            pool = None if reply.pool is None else self._catalog.pool(reply.pool)
            self._events.finished(
                reply,
                outcome,
                tenant=None if tenant is None else tenant.name,
                pool=pool,
                stream=stream,
                record=request_record,
            )

    async def _handle(  # noqa: PLR0917 - the request's parts, known by now
        self,
        endpoint: Endpoint,
        scope: Scope,
        receive: Receive,
        reply: Reply,
        tenant: Tenant,
        parsed: ParsedRequest,
        stored: tuple[str, ResponseLocation] | None,
        record: RequestRecord,
    ) -> bool:
        """Resolve the model, build the context, serve it (falling back to other pools on a refusal,
        `gateway.proxy.fallback`), remember a stored response; True when the client left meanwhile."""
        served = self._served(endpoint, scope, parsed)
        reply.pool = served.pool.model
        others = None if stored is None else self._affinity.others(served.pool, *stored)  # before headers
        priority = self._tenants.resolve_priority(tenant, header(scope, PRIORITY_HEADER))

        def context(served: ServedModel) -> RequestContext:
            reply.pool = served.pool.model
            built = build_context(
                request_id=reply.request_id,
                started_s=reply.started_s,
                scope=scope,
                parsed=parsed,
                served=served,
                tenant=tenant,
                priority=priority,
                engine_key=self._engine_keys.get(served.pool.model),
                record=record,
                cap_tier=self._tenants.cap_tier(priority),
            )
            if endpoint is Endpoint.RESPONSES:  # the id's replica is recorded before the last byte
                reply.before_end = functools.partial(self._affinity.remember, built, reply)
            return built

        ctx = context(served)
        ctx = ctx if others is None else self._affinity.pin(ctx, others)
        fallbacks = [] if others is not None else self._catalog.fallbacks(served.pool, endpoint.capability)
        async with DisconnectWatcher(receive) as watcher:
            reply.watcher = watcher
            ctx = await self._fallback.serve(ctx, reply, self._serve, fallbacks, context)
        await reply.run_before_end()  # when no relayed response ended (an idempotent replay: a no-op)
        return watcher.disconnected

    def _tenant(self, scope: Scope) -> Tenant:
        try:
            return self._tenants.resolve(tenant_authorization(scope))
        except AuthenticationFailed as exc:
            raise Unauthorized(exc.message) from None

    def _served(self, endpoint: Endpoint, scope: Scope, parsed: ParsedRequest) -> ServedModel:
        """The pool and name of the request's model (aliases resolved; 404 `model_not_found`), when
        the pool serves the endpoint (404 `endpoint_not_served` naming the pool and what it serves)."""
        resolved = self._catalog.resolve(parsed.model)
        if resolved is None:
            raise ModelNotFound(f"the model {parsed.model!r} does not exist")
        pool = resolved.pool
        served = pool.settings.served_endpoints
        if endpoint.capability not in served:
            raise EndpointNotServed(
                f"pool {pool.model!r} does not serve {scope['path']} (its engine serves: "
                f"{', '.join(sorted(served))})"
            )
        return resolved

    async def _parse(
        self, endpoint: Endpoint, scope: Scope, raw: bytes, tenant: Tenant, record: RequestRecord
    ) -> tuple[ParsedRequest, tuple[str, ResponseLocation] | None]:
        """The parsed request (told to `record`) and, when it needs a stored response (a
        `/v1/responses/{id}` call or a `previous_response_id`), that response's id and location (404
        when unknown or `tenant`'s not)."""
        call = response_call(scope["path"]) if endpoint is Endpoint.RESPONSES else None
        if call is not None:
            location = await self._affinity.locate(tenant, call.response_id)
            parsed = parse_response_call(
                scope["method"], scope["path"], scope.get("query_string", b""), location.model
            )
            record.request_parsed(parsed)
            return parsed, (call.response_id, location)
        parsed = parse_request(endpoint, raw)
        record.request_parsed(parsed)
        previous = parsed.previous_response_id
        if previous is None:
            return parsed, None
        return parsed, (previous, await self._affinity.locate(tenant, previous))

    async def _serve(self, ctx: RequestContext, reply: Reply) -> None:
        """Serve (a loadable LoRA adapter nobody serves loaded first: `gateway.proxy.adapter_loading`),
        or replay / record a non-streamed request that carries an `Idempotency-Key`
        (`gateway.proxy.idempotent_serving`)."""
        await self._adapters.ensure(ctx.pool, ctx.served_model)
        await self._idempotent.serve(ctx, reply)
