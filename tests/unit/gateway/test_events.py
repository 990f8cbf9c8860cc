"""The serve path's event port: one call per event, each subscriber bound once to the events it
overrides, features that are off not subscribed, metric children resolved once."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.composition import Components
from gateway.config.settings import PoolSettings, parse_settings
from gateway.fleet.autoscaling import AutoscaleSink
from gateway.observability.events import ServeEvents, ServeEventSink
from gateway.observability.record_events import RecordSink
from gateway.proxy.account import ServeMetrics
from gateway.proxy.context import RequestContext
from gateway.proxy.failure_charges import Charge, FailureCause
from gateway.proxy.reply import Reply
from gateway.upstream.failure_kinds import FailureKind
from gateway.upstream.registry import Pool, ReplicaRegistry
from router.types import Branch, Decision
from tests.servers import free_port


class Log(ServeEventSink):
    def __init__(self, name: str, heard: list[str]) -> None:
        self.name = name
        self.heard = heard

    def retried(self, ctx: RequestContext, reason: str) -> None:
        self.heard.append(f"{self.name}: retried {reason}")

    def continued(self, ctx: RequestContext) -> None:
        self.heard.append(f"{self.name}: continued")


class RetriesOnly(ServeEventSink):
    def __init__(self, heard: list[str]) -> None:
        self.heard = heard

    def retried(self, ctx: RequestContext, reason: str) -> None:
        self.heard.append(f"retries only: {reason}")


CTX = cast(RequestContext, SimpleNamespace(model="m"))


def test_each_event_reaches_the_sinks_that_override_it_in_order() -> None:
    heard: list[str] = []
    events = ServeEvents([Log("a", heard), None, RetriesOnly(heard)])
    events.retried(CTX, "connect")
    events.continued(CTX)
    events.attempt_ended(CTX, None)  # nobody subscribed
    assert heard == ["a: retried connect", "retries only: connect", "a: continued"]


def test_an_unsubscribed_event_is_a_shared_no_op_and_a_lone_subscriber_is_called_directly() -> None:
    heard: list[str] = []
    sink = RetriesOnly(heard)
    events = ServeEvents([sink])
    assert events.retried == sink.retried, "one subscriber: its own method, no fan-out in between"
    assert events.continued is events.arrived is events.finished, "no subscriber: one shared no-op"
    assert ServeEvents([]).retried is events.continued


def _settings(**extra: Any) -> Any:
    pool = {"model": "m", "replicas": {"static": [f"http://127.0.0.1:{free_port()}"]}}
    return parse_settings({"pools": [{**pool, **extra.pop("pool", {})}], **extra})


@pytest.mark.parametrize(
    ("extra", "subscribed"),
    [
        ({}, [ServeMetrics]),
        (
            {
                "tracing": {"enabled": True, "exporter": "none"},
                "pool": {"max_concurrency_per_replica": 4, "autoscale": {"decode_tokens_per_s": 400}},
            },
            [RecordSink, ServeMetrics, AutoscaleSink],
        ),
        ({"access_log": {"enabled": True, "stream": "none"}}, [RecordSink, ServeMetrics]),
    ],
    ids=["all off", "tracing and autoscaling", "access log"],
)
async def test_features_that_are_off_do_not_subscribe(extra: dict[str, Any], subscribed: list[type]) -> None:
    """Tracing and access log off: no record sink, so no event reaches a record; no `autoscale:` pool:
    no autoscaling sink."""
    components = Components(_settings(**extra))
    await components.start()
    try:
        assert components.events is not None
        assert [type(sink) for sink in components.events.sinks] == subscribed
    finally:
        await components.aclose()


def _counting(family: Any, calls: list[tuple[str, ...]]) -> None:
    resolve = family.labels

    def labels(*values: str) -> Any:
        calls.append(values)
        return resolve(*values)

    family.labels = labels


def test_the_metrics_resolve_each_child_once_not_per_request() -> None:
    metrics = GatewayMetrics()
    calls: list[tuple[str, ...]] = []
    for family in (metrics.requests_total, metrics.request_duration_seconds, metrics.upstream_failures_total):
        _counting(family, calls)
    settings = PoolSettings.model_validate({"model": "m", "replicas": {"static": ["http://127.0.0.1:1"]}})
    pool = cast(Pool, SimpleNamespace(model="m", settings=settings, prefill=None))
    sink = ServeMetrics(metrics)
    replica = cast(Any, SimpleNamespace(replica_id="r1"))
    for _ in range(3):
        reply = Reply(request_id="r", send=cast(Any, None), clock=FakeClock())
        sink.charged(CTX, pool, Charge(replica, FailureKind.CONNECT, FailureCause.REPLICA))
        sink.finished(reply, "upstream_connect", tenant=None, pool=pool, stream=False)
    assert sorted(calls) == [("m",), ("m", "replica", "connect"), ("m", "upstream_connect")]
    requests = {"model": "m", "outcome": "upstream_connect"}
    assert metrics.registry.get_sample_value("llm_gateway_requests_total", requests) == 3


def test_a_replicas_slot_gauges_are_resolved_once_per_replica() -> None:
    settings = parse_settings({"pools": [{"model": "m", "replicas": {"static": ["http://10.0.0.1:8000"]}}]})
    metrics = GatewayMetrics()
    calls: list[tuple[str, ...]] = []
    _counting(metrics.inflight, calls)
    _counting(metrics.prefill_tokens_inflight, calls)
    registry = ReplicaRegistry(settings, metrics, FakeClock(), random.Random(0))
    (replica,) = registry.pools["m"].replicas.values()
    decision = Decision(replica_id=replica.replica_id, policy="p", branch=Branch.LEAST_LOAD)
    release: list[Callable[[], None]] = []
    for _ in range(3):
        slot = registry.claim(replica, decision, 10, uncached_tokens=5)
        slot.first_token()
        release.append(slot.release)
    inflight = {"replica": replica.replica_id}
    assert metrics.registry.get_sample_value("llm_gateway_inflight", inflight) == 3
    for each in release:
        each()
    assert calls == [(replica.replica_id,), (replica.replica_id,)], "inflight and prefill tokens, once each"
    assert metrics.registry.get_sample_value("llm_gateway_inflight", inflight) == 0
