from __future__ import annotations

import asyncio
import contextlib

import pytest
from pydantic import ValidationError

from gateway.upstream.discovery import (
    DiscoveryRunner,
    DnsDiscovery,
    KubernetesEndpointSliceDiscovery,
    ReplicaSet,
    ReplicaSources,
    ReplicaState,
    StaticDiscovery,
    build_discovery,
)
from gateway.upstream.discovery.types import format_url
from tests.unit.discovery.conftest import Collector


def test_replica_set_is_an_immutable_mapping() -> None:
    replicas = ReplicaSet.of(ready=["http://a:1"], draining=["http://b:1"])
    assert replicas["http://a:1"] is ReplicaState.READY and len(replicas) == 2
    assert replicas.ready == {"http://a:1"} and replicas.draining == {"http://b:1"}
    assert replicas == ReplicaSet({"http://b:1": "draining", "http://a:1": "ready"})  # type: ignore[dict-item]
    assert hash(replicas) == hash(ReplicaSet(dict(replicas)))
    assert replicas.all_draining().ready == frozenset()
    assert "a:1: ready" in repr(replicas)
    with pytest.raises(TypeError):
        replicas["http://c:1"] = ReplicaState.READY  # type: ignore[index]
    assert ReplicaSet.of(ready=["x"], draining=["x"]) == ReplicaSet.of(ready=["x"])  # ready wins


def test_format_url() -> None:
    assert format_url("http", "10.1.2.3", 80) == "http://10.1.2.3:80"
    assert format_url("https", "fd00::1", 443) == "https://[fd00::1]:443"
    assert format_url("http", "vllm-0.vllm.ml.svc", 8000) == "http://vllm-0.vllm.ml.svc:8000"


def test_sources_accept_one_kind_and_keep_static_compatible() -> None:
    assert ReplicaSources.model_validate({"static": ["http://x:1/"]}).static == ["http://x:1"]
    assert ReplicaSources.model_validate({"static": []}).dynamic is False
    dns = ReplicaSources.model_validate({"dns": {"name": "vllm.ml.svc", "port": 8000}})
    assert dns.dns is not None and dns.dns.refresh_s == 5.0 and dns.dynamic
    k8s = ReplicaSources.model_validate({"kubernetes": {"namespace": "ml", "service": "vllm", "port": 8000}})
    assert k8s.kubernetes is not None
    assert k8s.kubernetes.label_selector() == "kubernetes.io/service-name=vllm"
    sel = ReplicaSources.model_validate({"kubernetes": {"selector": "app=vllm", "port": "http"}})
    assert sel.kubernetes is not None and sel.kubernetes.label_selector() == "app=vllm"
    assert sel.kubernetes.port == "http" and sel.kubernetes.max_stale_s == 300.0
    quoted = ReplicaSources.model_validate({"kubernetes": {"service": "s", "port": "8000"}})
    assert quoted.kubernetes is not None and quoted.kubernetes.port == 8000  # an env override is a string


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"static": ["http://x:1"], "dns": {"name": "n", "port": 1}}, "not static and dns"),
        ({"dns": {"name": "n", "port": 1}, "kubernetes": {"service": "s"}}, "not dns and kubernetes"),
        ({"kubernetes": {"service": "s", "selector": "a=b"}}, "exactly one of 'service' or 'selector'"),
        ({"kubernetes": {}}, "exactly one of 'service' or 'selector'"),
        ({"dns": {"name": "n", "port": 0}}, "dns.port"),
        ({"kubernetes": {"service": "s", "port": 70000}}, "port must be 1..65535"),
        ({"kubernetes": {"service": "s", "max_stale_s": 0}}, "kubernetes.max_stale_s"),
        ({"dns": {"name": "n", "port": 1, "refresh": 3}}, "dns.refresh"),
        ({"static": ["ftp://x"]}, "static"),
    ],
)
def test_invalid_sources_name_the_problem(raw: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        ReplicaSources.model_validate(raw)
    text = str(info.value) + " ".join(".".join(map(str, e["loc"])) for e in info.value.errors())
    assert fragment in text


async def test_build_discovery_picks_the_source() -> None:
    seen = Collector()
    static = build_discovery(ReplicaSources(static=["http://a:1"]), seen)
    assert isinstance(static, StaticDiscovery)
    task = asyncio.create_task(static.run())
    assert await seen.next() == ReplicaSet.of(ready=["http://a:1"])
    assert static.current == ReplicaSet.of(ready=["http://a:1"])
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

    dns = build_discovery(ReplicaSources.model_validate({"dns": {"name": "n", "port": 1}}), seen)
    assert isinstance(dns, DnsDiscovery) and dns.current is None
    k8s_settings = {"kubernetes": {"service": "vllm", "api_url": "http://127.0.0.1:8001"}}
    k8s = build_discovery(ReplicaSources.model_validate(k8s_settings), seen, environ={})
    assert isinstance(k8s, KubernetesEndpointSliceDiscovery)
    assert k8s.namespace == "default" and k8s.label_selector == "kubernetes.io/service-name=vllm"


async def test_runner_starts_stops_and_reports_a_failing_consumer() -> None:
    seen = Collector()
    runner = DiscoveryRunner(StaticDiscovery(["http://a:1"], seen), "m")
    runner.start()
    assert await seen.next() == ReplicaSet.of(ready=["http://a:1"])
    assert runner.running
    await runner.stop()
    assert not runner.running and runner.failure is None

    def broken(replicas: ReplicaSet) -> None:
        raise RuntimeError("registry bug")

    failing = DiscoveryRunner(StaticDiscovery(["http://a:1"], broken), "m")
    failing.start()
    async with asyncio.timeout(2):
        while failing.running:
            await asyncio.sleep(0.01)
    assert isinstance(failing.failure, RuntimeError)
    await failing.stop()
