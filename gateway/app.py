"""The app factory: validated settings in, one ASGI application out (no module-level state).

The OpenAI proxy endpoints are dispatched as plain ASGI to `ProxyHandler` (no framework layers on the
hot path); everything else (models, health, readiness, metrics, admin) is a small FastAPI app. The
components are built and closed by the composition root (`gateway.composition.Components`); this app
owns the lifespan around it: start-up builds them, and shutdown stops admitting (`draining`), leaves
the gateway membership (`gateway.fleet.instance_membership`), waits up to `server.drain_timeout_s` for
in-flight requests, then closes every component in reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client.exposition import choose_encoder
from starlette.exceptions import HTTPException as StarletteHTTPException

from admission.tenants import AuthenticationFailed
from core.clock import Clock
from gateway.api.asgi_io import Message, Receive, Scope, Send, header, send_response
from gateway.api.openapi import OPENAPI_PATH, openapi_document
from gateway.api.request_ids import request_id_of
from gateway.api.request_parsing import Endpoint
from gateway.api.response_calls import response_call
from gateway.api.tenant_key import tenant_authorization
from gateway.base.error_mapping import to_response
from gateway.base.errors import (
    BadRequest,
    Draining,
    GatewayError,
    MethodNotAllowed,
    RouteNotFound,
    Unauthorized,
)
from gateway.composition import Components
from gateway.config.settings import Settings
from gateway.observability.ops_log import ASGIApp, OpsLog
from gateway.ops.admin import build_admin_router

logger = logging.getLogger(__name__)

ABORT_GRACE_S = 2.0
"""After the drain timeout, how long aborted requests get to send their terminal error."""
_PROXY_ROUTES = {endpoint.value: endpoint for endpoint in Endpoint}


class GatewayApp:
    """The ASGI application (see module docstring); its components are `state` (the composition root)."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        *,
        span_exporter: SpanExporter | None = None,
    ) -> None:
        self.state = Components(settings, clock, rng, span_exporter=span_exporter)
        self._ops = _build_ops_app(self.state)
        self._ops_log: OpsLog | None = None
        """Access-log lines of the requests outside the serve path; None while the access log is off."""

    @property
    def draining(self) -> bool:
        return self.state.proxy is not None and self.state.proxy.draining

    async def startup(self) -> None:
        await self.state.start()
        observer = self.state.observer
        if observer is not None and observer.access_log is not None:
            self._ops_log = OpsLog(observer.access_log, self._tenant_name)

    def _tenant_name(self, scope: Scope) -> str | None:
        """The name of the tenant the request's key resolves to (None when refused)."""
        try:
            return self.state.tenants.resolve(tenant_authorization(scope)).name
        except AuthenticationFailed:
            return None

    async def drain(self) -> None:
        """Graceful stop: readiness goes false and new requests get 503 `draining` at once, and the
        instance leaves the gateway membership; in-flight requests get up to `server.drain_timeout_s` to
        finish; whatever still runs then ends with the terminal error (a final SSE error event for
        started streams, a 503 otherwise)."""
        proxy = self.state.proxy
        if proxy is None:
            return
        proxy.start_drain()
        await self.state.leave_membership()  # no new arrivals here from now on: the others' share grows
        registry = self.state.registry
        try:
            async with asyncio.timeout(self.state.settings.server.drain_timeout_s):
                await registry.wait_idle()
        except TimeoutError:
            logger.warning("drain timeout: ending %d request(s) still in flight", registry.total_inflight())
            proxy.abort_all(Draining("the gateway shut down before this request finished"))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(ABORT_GRACE_S):
                    await registry.wait_idle()

    async def shutdown(self) -> None:
        """Drain (see `drain`), then close every component in reverse order (`Components.aclose`)."""
        await self.drain()
        await self.state.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if scope["method"] == "HEAD":  # served as GET, without its body (RFC 9110 §9.3.2)
                scope, send = {**scope, "method": "GET"}, _without_body(send)
            endpoint, allow = _proxy_route(scope["path"])
            proxy = self.state.proxy
            if endpoint is not None and proxy is not None and scope["method"] in allow:
                await proxy(endpoint, scope, receive, send)  # the serve path writes its own line
                return
            answer: ASGIApp = self._ops
            if endpoint is not None and proxy is not None:
                answer = functools.partial(_refuse_method, endpoint, allow)
            if self._ops_log is None:  # access log off
                await answer(scope, receive, send)
            else:
                await self._ops_log.serve(answer, scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self._ops(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _refuse_method(
    endpoint: Endpoint, allow: tuple[str, ...], scope: Scope, receive: Receive, send: Send
) -> None:
    """405 `method_not_allowed` on a proxied path, with `Allow` and in the endpoint's error shape."""
    refusal = MethodNotAllowed(f"method {scope['method']} not allowed on {scope['path']}", allow=allow)
    answer = to_response(refusal, endpoint.surface)
    headers = [*answer.headers, ("x-request-id", request_id_of(header(scope, b"x-request-id")))]
    await send_response(send, answer.status, headers, answer.body)


def _without_body(send: Send) -> Send:
    """`send` with every body chunk emptied: a HEAD answer has GET's status and headers (its
    `content-length` included) and no body."""

    async def head_send(message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            message = {**message, "body": b""}
        await send(message)

    return head_send


def _proxy_route(path: str) -> tuple[Endpoint | None, tuple[str, ...]]:
    """The proxied endpoint a path belongs to and the methods it answers: `POST` on the endpoints'
    own paths, `GET`/`DELETE` on `/v1/responses/{id}` and `POST` on its `/cancel`; else (None, ())."""
    endpoint = _PROXY_ROUTES.get(path)
    if endpoint is not None:
        return endpoint, ("POST",)
    call = response_call(path)
    if call is not None:
        return Endpoint.RESPONSES, call.allow
    return None, ()


def _error_response(error: GatewayError, request: Request | None = None) -> Response:
    """The contract answer for `error` on the operations app, with the request id (echoed or new)."""
    answer = to_response(error)
    headers = dict(answer.headers)
    headers["x-request-id"] = request_id_of(
        request.headers.get("x-request-id") if request is not None else None
    )
    return Response(content=answer.body, status_code=answer.status, headers=headers)


def _build_ops_app(state: Components) -> FastAPI:
    app = FastAPI(title="llm-gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(build_admin_router(state.settings, state.registry, state.clock, state.preemption))

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        return _error_response(exc, request)

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where or 'body'}: {first.get('msg', 'invalid request body')}"
        return _error_response(BadRequest(message), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            allow = tuple(m.strip() for m in (exc.headers or {}).get("Allow", "GET").split(","))
            refusal = MethodNotAllowed(
                f"method {request.method} not allowed on {request.url.path}", allow=allow
            )
            return _error_response(refusal, request)
        return _error_response(RouteNotFound(f"no route {request.method} {request.url.path}"), request)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, object]:
        """What the fleet serves now (`ModelCatalog.listing`: pools with an eligible replica, their
        declared names and discovered adapters, aliases); with tenants configured, the same API key
        check as the inference routes (401 `unauthorized`; `Authorization` or `x-api-key`). Every
        tenant may use every pool."""
        try:
            state.tenants.resolve(tenant_authorization(request.scope))
        except AuthenticationFailed as exc:
            raise Unauthorized(exc.message) from None
        return {"object": "list", "data": state.catalog.listing(int(state.started_s))}

    @app.get("/healthz")
    @app.get("/health")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        ready = state.ready()
        body = b'{"ready":true}' if ready else b'{"ready":false}'
        return Response(content=body, status_code=200 if ready else 503, media_type="application/json")

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        """Prometheus text format, or OpenMetrics when the scrape's `Accept` asks for
        `application/openmetrics-text` (the only format that carries exemplars: trace ids on the
        duration and TTFT histograms when tracing is on)."""
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(
            content=encoder(state.metrics.scrape_registry), headers={"content-type": content_type}
        )

    openapi_body = orjson.dumps(openapi_document())

    @app.get(OPENAPI_PATH)
    async def openapi() -> Response:
        """OpenAPI 3.1 description of the proxied surface and the error contract (gateway.api.openapi)."""
        return Response(content=openapi_body, media_type="application/json")

    return app


def create_app(
    settings: Settings,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    *,
    span_exporter: SpanExporter | None = None,
) -> GatewayApp:
    """Build a gateway application from validated settings (`span_exporter`: see `Components`)."""
    return GatewayApp(settings, clock=clock, rng=rng, span_exporter=span_exporter)
