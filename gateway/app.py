"""The app factory: validated settings in, one ASGI application out (no module-level state).

The OpenAI proxy endpoints are dispatched as plain ASGI to `ProxyHandler` (no framework layers on the
hot path); everything else (models, health, readiness, metrics, admin) is a small FastAPI app. The
top-level app owns the lifespan: it opens the one shared upstream client at start-up and, at shutdown,
stops admitting (`draining`), leaves the gateway membership (`gateway.instance_membership`), waits up to
`server.drain_timeout_s` for in-flight requests, then closes the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, field

import aiohttp
import httpx
from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.clock import Clock, SystemClock
from core.shared_state import RedisOperation
from gateway.api.admin import build_admin_router
from gateway.api.asgi_io import Receive, Scope, Send, send_response
from gateway.api.request_parsing import Endpoint
from gateway.error_mapping import to_response
from gateway.errors import Draining, GatewayError, MethodNotAllowed, RouteNotFound
from gateway.instance_membership import GatewayMembership, RedisMembership
from gateway.metrics import METRICS_CONTENT_TYPE, GatewayMetrics
from gateway.proxy.handler import ProxyHandler
from gateway.settings import Settings
from gateway.upstream.discovery.factory import DiscoveryRunner, build_discovery
from gateway.upstream.discovery.types import ReplicaSet
from gateway.upstream.engine_metrics import adapter_for
from gateway.upstream.health import HealthChecker
from gateway.upstream.http_client import build_control_client, build_proxy_session
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.scraper import EngineScraper, ScrapeMetrics

logger = logging.getLogger(__name__)

ABORT_GRACE_S = 2.0
"""After the drain timeout, how long aborted requests get to send their terminal error."""
_PROXY_ROUTES = {endpoint.value: endpoint for endpoint in Endpoint}


@dataclass
class GatewayState:
    """Everything one app instance owns; reachable from tests as `app.state`."""

    settings: Settings
    metrics: GatewayMetrics
    registry: ReplicaRegistry
    session: aiohttp.ClientSession | None = None
    control_client: httpx.AsyncClient | None = None
    proxy: ProxyHandler | None = None
    started_s: float = field(default_factory=time.time)
    discovered: set[str] = field(default_factory=set)
    """Pools with a dynamic replica source that has reported at least once."""

    def ready(self) -> bool:
        """Readiness: not draining, and every pool knows its replicas (static, or discovered once)."""
        if self.proxy is None or self.proxy.draining:
            return False
        return all(
            pool.model in self.discovered
            if pool.settings.replicas.dynamic
            else bool(pool.settings.replicas.static)
            for pool in self.registry.pools.values()
        ) and bool(self.registry.pools)


class GatewayApp:
    """The ASGI application (see module docstring)."""

    def __init__(
        self, settings: Settings, clock: Clock | None = None, rng: random.Random | None = None
    ) -> None:
        metrics = GatewayMetrics()
        self._clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random(settings.seed)
        self.state = GatewayState(
            settings, metrics, ReplicaRegistry(settings, metrics, self._clock, self._rng)
        )
        self._health: HealthChecker | None = None
        self._scrapers: list[EngineScraper | None] = []
        self._discovery: list[DiscoveryRunner] = []
        self._membership: GatewayMembership | None = None
        self._ops = _build_ops_app(self.state, self._clock)

    @property
    def draining(self) -> bool:
        return self.state.proxy is not None and self.state.proxy.draining

    async def startup(self) -> None:
        if self.state.session is not None:
            return
        self.state.session = build_proxy_session(self.state.settings.upstream)
        self.state.control_client = build_control_client(self.state.settings.upstream)
        self.state.proxy = ProxyHandler(
            self.state.settings,
            self.state.registry,
            self.state.session,
            self.state.metrics,
            clock=self._clock,
            rng=random.Random(self._rng.random()),
        )
        self._health = HealthChecker(
            self.state.registry, self.state.control_client, self._clock, random.Random(self._rng.random())
        )
        self._health.start()
        self.state.proxy.start()
        self._start_membership(self.state.proxy)
        self._start_discovery()
        self._scrapers = [self._build_scraper(pool) for pool in self.state.registry.pools.values()]
        for scraper in self._scrapers:
            if scraper is not None:
                scraper.start()

    def _start_membership(self, proxy: ProxyHandler) -> None:
        """Measure k, the live gateway instances, for the autoscaling signal's traffic share
        (`gateway.instance_membership`): with Redis state and a pool whose `autoscale.gateway_instances`
        is unset."""
        backend, signals = proxy.state_backend, proxy.signals
        if backend is None or not signals.measures_gateway_instances:
            return
        errors = self.state.metrics.state_errors_total.labels(str(RedisOperation.MEMBERSHIP_HEARTBEAT))
        self._membership = GatewayMembership(
            RedisMembership(backend),
            ttl_s=self.state.settings.state.replica_lease_ttl_s,
            clock=self._clock,
            on_count=signals.set_gateway_instances,
            on_error=errors.inc,
        )
        self._membership.start()

    async def _leave_membership(self) -> None:
        if self._membership is not None:
            await self._membership.leave()

    def _start_discovery(self) -> None:
        """One discovery source per pool with a dynamic replica source (`dns` or `kubernetes`)."""
        registry = self.state.registry
        for pool in registry.pools.values():
            if not pool.settings.replicas.dynamic:
                continue

            def on_change(target: ReplicaSet, pool: Pool = pool) -> None:
                registry.apply_membership(pool, target)
                self.state.discovered.add(pool.model)

            runner = DiscoveryRunner(build_discovery(pool.settings.replicas, on_change), pool.model)
            runner.start()
            self._discovery.append(runner)

    def _build_scraper(self, pool: Pool) -> EngineScraper | None:
        """An engine /metrics scraper for `pool`, unless disabled or the flavour exports nothing."""
        adapter = adapter_for(pool.settings.engine)
        if adapter is None or not pool.settings.scrape.enabled or self.state.control_client is None:
            return None
        m = self.state.metrics
        return EngineScraper(
            pool.settings.scrape,
            adapter,
            pool.replicas.values,
            self.state.control_client,
            model=pool.settings.upstream_model or pool.model,
            metrics=ScrapeMetrics(
                errors=m.scrape_errors_total,
                running=m.replica_engine_running,
                waiting=m.replica_engine_waiting,
                kv_usage_ratio=m.replica_kv_usage_ratio,
                prefix_cache_hit_ratio=m.replica_prefix_cache_hit_ratio,
            ),
            clock=self._clock.now_s,
            rng=random.Random(self._rng.random()),
        )

    async def drain(self) -> None:
        """Graceful stop: readiness goes false and new requests get 503 `draining` at once, and the
        instance leaves the gateway membership; in-flight requests get up to `server.drain_timeout_s` to
        finish; whatever still runs then ends with the terminal error (a final SSE error event for
        started streams, a 503 otherwise)."""
        proxy = self.state.proxy
        if proxy is None:
            return
        proxy.start_drain()
        await self._leave_membership()  # no new arrivals here from now on: the others' share grows
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
        """Drain (see `drain`), stop the background loops, close the upstream client."""
        await self.drain()
        for runner in self._discovery:
            await runner.stop()
        if self._health is not None:
            await self._health.stop()
        for scraper in self._scrapers:
            if scraper is not None:
                await scraper.stop()
        await self._leave_membership()  # before the state backend closes with the proxy
        if self.state.proxy is not None:
            await self.state.proxy.aclose()
        if self.state.session is not None:
            await self.state.session.close()
            self.state.session = None
        if self.state.control_client is not None:
            await self.state.control_client.aclose()
            self.state.control_client = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            endpoint = _PROXY_ROUTES.get(scope["path"])
            if endpoint is not None and self.state.proxy is not None:
                if scope["method"] == "POST":
                    await self.state.proxy(endpoint, scope, receive, send)
                else:
                    answer = to_response(
                        MethodNotAllowed(f"method {scope['method']} not allowed on {scope['path']}")
                    )
                    await send_response(send, answer.status, answer.headers, answer.body)
                return
            await self._ops(scope, receive, send)
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


def _error_response(error: GatewayError) -> Response:
    answer = to_response(error)
    return Response(content=answer.body, status_code=answer.status, headers=dict(answer.headers))


def _build_ops_app(state: GatewayState, clock: Clock) -> FastAPI:
    app = FastAPI(title="llm-gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(build_admin_router(state.settings, state.registry, clock))

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            return _error_response(
                MethodNotAllowed(f"method {request.method} not allowed on {request.url.path}")
            )
        return _error_response(RouteNotFound(f"no route {request.method} {request.url.path}"))

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        created = int(state.started_s)
        data = [
            {"id": pool.model, "object": "model", "created": created, "owned_by": "llm-gateway"}
            for pool in state.registry.pools.values()
            if pool.has_eligible_replica()
        ]
        return {"object": "list", "data": data}

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
    async def metrics() -> Response:
        return Response(content=state.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    return app


def create_app(
    settings: Settings, clock: Clock | None = None, rng: random.Random | None = None
) -> GatewayApp:
    """Build a gateway application from validated settings."""
    return GatewayApp(settings, clock=clock, rng=rng)
