"""The composition root: every component of one gateway instance, built from settings and closed in
reverse order. Nothing else constructs a component; nothing else closes one.

Built at construction (no event loop needed): the metrics and the replica registry (pools, their
routing policies, replica state) — what the operations endpoints read even before start-up.
Built by `start()`, in this order, each registered for closing as it is built:

    from `gateway.fleet.shared_state_assembly`: state backend (Redis, or none with memory state) · tenant
    gate (rate limits + bulkheads, on memory or Redis stores) · slot credits (Redis only: the
    per-replica cap shared by every instance) · prefix-index sharing (Redis only: each pool's index
    records exchanged, `gateway.fleet.prefix_sharing`)
    router (decide + its metrics) · admission (a controller per pool, dispatching through the router)
    upstream session + client · control client (health checks, scrapes)
    request observer (tracer + span exporter, access log writer: `gateway.observability`)
    autoscaling signals · containment · the serve path (`gateway.proxy.serve_path`: the event port and
    its subscribers, retry policies, each pool's legs, the request server) · idempotency store · proxy
    handler
    health checker · gateway-instance membership (Redis) · discovery runners · engine scrapers and
    model discovery (`gateway.upstream.pool_watchers`)

`aclose()` closes them in reverse order: background loops first (scrapers, discovery, membership,
health, the autoscaling signal), then the observer (queued spans exported, access-log lines written:
requests have ended by then), then the HTTP clients, then the slot credits and the state backend
last, so no loop ever runs against a closed connection. A failure while starting closes whatever was
already built.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
from opentelemetry.sdk.trace.export import SpanExporter

from core.clock import Clock, SystemClock
from core.shared_state import RedisBackend
from core.state_outage import RedisOperation
from gateway.base.metrics import GatewayMetrics
from gateway.config.engine_keys import engine_keys
from gateway.config.settings import ConfigError, Settings
from gateway.fleet.autoscaling import AutoscaleSignals
from gateway.fleet.instance_membership import GatewayMembership, RedisMembership
from gateway.fleet.shared_state_assembly import (
    share_lowest_class_counts,
    share_prefix_indexes,
    slot_credits,
    state_backend,
    tenant_gate,
)
from gateway.observability.events import ServeEvents
from gateway.observability.observer import RequestObserver
from gateway.observability.tracer import TracingUnavailable
from gateway.proxy.adapter_loading import AdapterLoader
from gateway.proxy.admission_assembly import build_admission, tenant_directory
from gateway.proxy.containment import Containment, build_containment
from gateway.proxy.disagg.admit import add_pair_admissions
from gateway.proxy.handler import ProxyHandler
from gateway.proxy.preemption import Preemption
from gateway.proxy.response_affinity import ResponseAffinity
from gateway.proxy.route import Router
from gateway.proxy.serve_path import build_serve_path
from gateway.proxy.stores.idempotency_redis import idempotency_store
from gateway.proxy.stores.quarantine_redis import QuarantineSync
from gateway.proxy.stores.response_state import response_state_store
from gateway.upstream.discovery.factory import DiscoveryRunner, build_discovery
from gateway.upstream.discovery.types import ReplicaSet
from gateway.upstream.health import HealthChecker
from gateway.upstream.http_client import build_control_client, build_proxy_session
from gateway.upstream.model_catalog import ModelCatalog
from gateway.upstream.pool_watchers import pool_watchers
from gateway.upstream.registry import Pool, ReplicaRegistry


class Components:
    """One gateway instance's components (see the module docstring); `app.state` in the ASGI app."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        *,
        span_exporter: SpanExporter | None = None,
    ) -> None:
        """`span_exporter` replaces the configured OTLP exporter when tracing is enabled (tests pass the
        SDK's in-memory exporter)."""
        self.settings = settings
        self._span_exporter = span_exporter
        self.clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random(settings.seed)
        self.metrics = GatewayMetrics()
        self.registry = ReplicaRegistry(settings, self.metrics, self.clock, self._child_rng())
        self.catalog = ModelCatalog(self.registry, settings.model_aliases)
        """Model names → pools (aliases, declared and discovered names); the proxy and `/v1/models`."""
        self.tenants = tenant_directory(settings)
        """API keys → tenants; the proxy routes and `/v1/models` authenticate with it."""
        self.started_s = time.time()
        self.discovered: set[str] = set()
        """Pools with a dynamic replica source that has reported at least once."""
        self.state_backend: RedisBackend | None = None
        self.session: aiohttp.ClientSession | None = None
        self.control_client: httpx.AsyncClient | None = None
        self.proxy: ProxyHandler | None = None
        self.signals: AutoscaleSignals | None = None
        self.observer: RequestObserver | None = None
        self.events: ServeEvents | None = None
        """The serve path's event port (`gateway.observability.events`), once started."""
        self._membership: GatewayMembership | None = None
        self.preemption = Preemption(self.registry)
        self._stack = contextlib.AsyncExitStack()

    @property
    def started(self) -> bool:
        return self.proxy is not None

    def ready(self) -> bool:
        """Readiness: not draining, and every pool knows its replicas (static, or discovered once)."""
        if self.proxy is None or self.proxy.draining:
            return False
        return bool(self.registry.pools) and all(
            pool.model in self.discovered
            if pool.settings.replicas.dynamic
            else bool(pool.settings.replicas.static)
            for pool in self.registry.pools.values()
        )

    async def start(self) -> None:
        """Build and start everything (module docstring); closes what was built if a step fails."""
        if self.started:
            return
        try:
            await self._start()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Close everything in reverse order of building (idempotent)."""
        await self._stack.aclose()
        self.proxy = None
        self.session = None
        self.control_client = None
        self.state_backend = None
        self.signals = None
        self.observer = None
        self.events = None
        self._membership = None

    async def _start(self) -> None:
        s, clock, metrics = self.settings, self.clock, self.metrics
        backend = self.state_backend = state_backend(s, metrics)
        if backend is not None:
            self._on_close(backend.aclose)
        gate = tenant_gate(backend, clock)
        credits = slot_credits(backend, s, clock, metrics)
        if credits is not None:
            self._on_close(credits.aclose)
        self._on_close(
            share_prefix_indexes(backend, s.state.share_prefix_index, self.registry.pools, metrics)
        )
        self._on_close(
            share_lowest_class_counts(backend, s, self.registry.pools, metrics, self.registry.notify_capacity)
        )
        admission = build_admission(
            s,
            registry=self.registry,
            router=Router(metrics),
            gate=gate,
            clock=clock,
            metrics=metrics,
            credits=credits,
        )
        add_pair_admissions(
            admission, s, registry=self.registry, gate=gate, clock=clock, metrics=metrics, credits=credits
        )
        self._on_close(self.preemption.aclose)
        self.session = build_proxy_session(s.upstream)
        self._on_close(self.session.close)
        self.control_client = build_control_client(s.upstream)
        self._on_close(self.control_client.aclose)
        observer = self.observer = self._observer()
        signals = self.signals = AutoscaleSignals(self.registry, metrics, clock, admission.queue_depth)
        serve_path = build_serve_path(
            registry=self.registry,
            admission=admission,
            containment=self._containment(backend),
            session=self.session,
            observer=observer,
            signals=signals,
            preemption=self.preemption,
            metrics=metrics,
            clock=clock,
            rng=self._child_rng,
        )
        self.events = serve_path.events
        idempotency = idempotency_store(backend, clock, s.idempotency)
        self.proxy = ProxyHandler(
            settings=s,
            catalog=self.catalog,
            adapters=AdapterLoader(self.registry, self.control_client, metrics, engine_keys(s), clock),
            tenants=self.tenants,
            admission=admission,
            server=serve_path.server,
            idempotency=idempotency,
            metrics=metrics,
            events=serve_path.events,
            engine_keys=engine_keys(s),
            affinity=ResponseAffinity(response_state_store(backend, clock), self.tenants),
            clock=clock,
        )
        signals.start()
        self._on_close(signals.stop)
        health = HealthChecker(self.registry, self.control_client, clock, self._child_rng())
        health.start()
        self._on_close(health.stop)
        self._start_membership(backend, signals)
        self._start_discovery()
        for watcher in pool_watchers(
            self.registry, self.control_client, self.metrics, self.clock, self._child_rng, engine_keys(s)
        ):
            watcher.start()
            self._on_close(watcher.stop)

    def _observer(self) -> RequestObserver:
        """Spans and access log per request (`gateway.observability`), flushed at close; an exporter whose
        package is missing is a `ConfigError`."""
        s = self.settings
        try:
            rng = self._child_rng() if s.access_log.enabled else None  # the log's sampling draws
            observer = RequestObserver(s.tracing, s.access_log, rng, self._span_exporter)
        except TracingUnavailable as exc:
            raise ConfigError(str(exc)) from None
        observer.start()
        self._on_close(observer.aclose)
        return observer

    def _on_close(self, close: Callable[[], Awaitable[object]]) -> None:
        self._stack.push_async_callback(close)

    def _child_rng(self) -> random.Random:
        return random.Random(self._rng.random())

    def _containment(self, backend: RedisBackend | None) -> Containment:
        """Attribution, quarantine and poison evidence per pool (`gateway.proxy.containment`); with
        Redis, a background sync of their local mirrors, registered for close."""
        containment, shared = build_containment(
            self.registry.pools.values(), backend, self.clock, self.metrics
        )
        if shared:
            errors = self.metrics.state_errors_total.labels("quarantine_sync_loop")
            sync = QuarantineSync(shared, on_error=errors.inc)
            sync.start()
            self._on_close(sync.stop)
        return containment

    def _start_membership(self, backend: RedisBackend | None, signals: AutoscaleSignals) -> None:
        """Measure k, the live gateway instances, for the autoscaling signal's traffic share
        (`gateway.fleet.instance_membership`): with Redis state and a pool whose `autoscale.gateway_instances`
        is unset. Leaving is registered for close (before the backend closes) and done by the drain."""
        if backend is None or not signals.measures_gateway_instances:
            return
        errors = self.metrics.state_errors_total.labels(str(RedisOperation.MEMBERSHIP_HEARTBEAT))
        membership = GatewayMembership(
            RedisMembership(backend),
            ttl_s=self.settings.state.replica_lease_ttl_s,
            clock=self.clock,
            on_count=signals.set_gateway_instances,
            on_error=errors.inc,
        )
        membership.start()
        self._membership = membership
        self._on_close(membership.leave)

    async def leave_membership(self) -> None:
        """Leave the gateway-instance membership now (the drain's first step); idempotent."""
        if self._membership is not None:
            await self._membership.leave()

    def _start_discovery(self) -> None:
        """One discovery source per pool with a dynamic replica source (`dns` or `kubernetes`)."""
        registry = self.registry
        for pool in registry.pools.values():
            if not pool.settings.replicas.dynamic:
                continue

            def on_change(target: ReplicaSet, pool: Pool = pool) -> None:
                already = {r.replica_id for r in pool.replicas.values() if r.discovery_draining}
                registry.apply_membership(pool, target)
                self.preemption.terminating(pool, already)
                self.discovered.add(pool.model)

            runner = DiscoveryRunner(build_discovery(pool.settings.replicas, on_change), pool.model)
            runner.start()
            self._on_close(runner.stop)
