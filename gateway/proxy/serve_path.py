"""The serve path's parts, assembled for the composition root (`gateway.composition`, its only caller):

    events  = the event port (`gateway.observability.events`) and its subscribers, in order: the
              request's record (only when tracing or the access log is on), the metrics
              (`gateway.proxy.account`), the autoscaling signal (only when a pool has `autoscale:`)
    legs    = each client-facing pool's (`gateway.proxy.legs`): `OneReplica` for an aggregated pool,
              `PrefillDecode` for a disaggregated one (SGLang's with the pool's bootstrap ports and an
              RNG for its rooms)
    tries   = the loop of tries over the containment and one retry policy (and budget) per pool
    server  = the `RequestServer` the proxy handler serves with

Nothing here starts a task or holds a connection: what needs closing is the composition root's.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from admission.retry_budget import RetryBudget
from core.clock import Clock
from gateway.base.metrics import GatewayMetrics
from gateway.fleet.autoscaling import AutoscaleSignals, AutoscaleSink
from gateway.observability.events import ServeEvents
from gateway.observability.observer import RequestObserver
from gateway.observability.record_events import RecordSink
from gateway.proxy.account import ServeMetrics
from gateway.proxy.admission_assembly import Admission
from gateway.proxy.aggregated_legs import OneReplica
from gateway.proxy.containment import Containment
from gateway.proxy.disagg.legs import BootstrapPorts
from gateway.proxy.disagg.pair import PrefillDecode
from gateway.proxy.legs import LegRunner, Legs
from gateway.proxy.preemption import Preemption
from gateway.proxy.retry_policy import RetryPolicy
from gateway.proxy.send import UpstreamClient
from gateway.proxy.serving import RequestServer
from gateway.proxy.tries import TryLoop
from gateway.upstream.registry import ReplicaRegistry


@dataclass(frozen=True, slots=True)
class ServePath:
    """The request server and the event port it reports to (the handler reports `finished` there)."""

    server: RequestServer
    events: ServeEvents


def build_serve_path(
    *,
    registry: ReplicaRegistry,
    admission: Admission,
    containment: Containment,
    session: aiohttp.ClientSession,
    observer: RequestObserver,
    signals: AutoscaleSignals,
    preemption: Preemption,
    metrics: GatewayMetrics,
    clock: Clock,
    rng: Callable[[], random.Random],
) -> ServePath:
    """The serve path over those components (module docstring); `rng()` gives each part that draws
    (retry jitter, SGLang rooms) its own RNG."""
    events = ServeEvents(
        [
            RecordSink() if observer.makes_records else None,
            ServeMetrics(metrics),
            AutoscaleSink(signals) if signals.scalers else None,
        ]
    )
    leg = LegRunner(
        upstream=UpstreamClient(session),
        registry=registry,
        preemption=preemption,
        containment=containment,
        events=events,
        clock=clock,
    )
    retry_policies = {
        pool.model: RetryPolicy(
            pool.settings.retries,
            RetryBudget(
                clock,
                budget_ratio=pool.settings.retries.budget_ratio,
                min_retries_per_s=pool.settings.retries.budget_min_per_s,
            ),
            rng(),
        )
        for pool in registry.pools.values()
    }
    tries = TryLoop(containment=containment, registry=registry, retry_policies=retry_policies, events=events)
    server = RequestServer(
        legs=_legs(registry, admission, leg, session, rng),
        tries=tries,
        containment=containment,
        events=events,
        observer=observer,
    )
    return ServePath(server, events)


def _legs(
    registry: ReplicaRegistry,
    admission: Admission,
    leg: LegRunner,
    session: aiohttp.ClientSession,
    rng: Callable[[], random.Random],
) -> dict[str, Legs]:
    legs: dict[str, Legs] = {}
    for pool in registry.pools.values():
        if not pool.client_facing:
            continue
        disagg = pool.settings.disaggregation
        if disagg is None:
            legs[pool.model] = OneReplica(admission.pool(pool.model), leg)
            continue
        pair = admission.pair(pool.model)
        if disagg.protocol == "vllm":
            legs[pool.model] = PrefillDecode(pair, leg)
            continue
        ports = BootstrapPorts(session, disagg.sglang.bootstrap_port, pool.settings.health.timeout_s)
        legs[pool.model] = PrefillDecode(pair, leg, ports, rng())
    return legs
