"""KubernetesEndpointSliceDiscovery against a fake API server on 127.0.0.1: list, watch, 410 Gone,
dropped watches, bookmarks, a pod's life (not-ready → terminating → deleted), the staleness bound and
in-cluster TLS + token rotation. The addresses in the slices are never contacted."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import pytest

from gateway.config.discovery_settings import KubernetesReplicas
from gateway.upstream.discovery.k8s_auth import ApiAccess
from gateway.upstream.discovery.kubernetes import KubernetesEndpointSliceDiscovery
from gateway.upstream.discovery.types import ReplicaSet
from tests.unit.discovery.conftest import Collector, StartDiscovery, eventually
from tests.unit.discovery.fake_apiserver import FakeApiServer, endpoint, endpoint_slice

A, B, C = "127.0.0.11", "127.0.0.12", "127.0.0.13"
URL_A, URL_B, URL_C = (f"http://{ip}:8000" for ip in (A, B, C))


async def test_pod_lifecycle_ready_notready_terminating_deleted(
    apiserver: FakeApiServer, run_discovery: StartDiscovery
) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A), endpoint(B)]))
    discovery, seen = run_discovery(apiserver)

    assert await seen.next() == ReplicaSet.of(ready=[URL_A, URL_B])
    first_list = apiserver.lists()[0]
    assert first_list.params["labelSelector"] == "kubernetes.io/service-name=vllm"
    assert first_list.headers["authorization"] == "Bearer test-token"
    await eventually(lambda: apiserver.watch_count == 1)
    watch = apiserver.watches()[0]
    assert watch.params["resourceVersion"] == "101"
    assert watch.params["allowWatchBookmarks"] == "true"

    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A), endpoint(B, ready=False, serving=False)]))
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])  # not ready: excluded

    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A), endpoint(B, False, True, True)]))
    assert await seen.next() == ReplicaSet.of(ready=[URL_A], draining=[URL_B])  # terminating: draining

    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])  # deleted

    apiserver.upsert(endpoint_slice("vllm-2", [endpoint(C)]))
    assert await seen.next() == ReplicaSet.of(ready=[URL_A, URL_C])  # a second slice
    apiserver.delete("vllm-2")
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])
    assert discovery.resource_version == str(apiserver.resource_version)
    assert discovery.lists_total == 1 and seen.pending() == 0


async def test_unchanged_membership_emits_nothing(
    apiserver: FakeApiServer, run_discovery: StartDiscovery
) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    _, seen = run_discovery(apiserver)
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])
    await eventually(lambda: apiserver.watch_count == 1)
    # a label-only change of the slice: a MODIFIED event, same members
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    apiserver.upsert(endpoint_slice("vllm-2", [endpoint(B, ready=False)]))
    apiserver.upsert(endpoint_slice("vllm-3", [endpoint(C)]))
    assert await seen.next() == ReplicaSet.of(ready=[URL_A, URL_C])
    assert len(seen.sets) == 2


async def test_dropped_watch_reconnects_from_the_last_resource_version(
    apiserver: FakeApiServer, run_discovery: StartDiscovery
) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    discovery, seen = run_discovery(apiserver)
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])
    await eventually(lambda: apiserver.watch_count == 1)
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A), endpoint(B)]))
    assert await seen.next() == ReplicaSet.of(ready=[URL_A, URL_B])
    version = discovery.resource_version

    await apiserver.drop_watches()  # connection reset mid-stream
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(B)]))  # happens while disconnected
    assert await seen.next() == ReplicaSet.of(ready=[URL_B])
    assert apiserver.watches()[-1].params["resourceVersion"] == version
    assert discovery.lists_total == 1  # resumed, not re-listed
    assert discovery.errors_total == 1


async def test_server_side_timeout_rewatches_without_error(
    apiserver: FakeApiServer, run_discovery: StartDiscovery
) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    discovery, seen = run_discovery(apiserver, watch_timeout_s=1)
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])
    await eventually(lambda: apiserver.watch_count == 1)
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A), endpoint(B)]))
    assert await seen.next() == ReplicaSet.of(ready=[URL_A, URL_B])
    await apiserver.drop_watches(graceful=True)  # the stream ends cleanly, as at timeoutSeconds
    await eventually(lambda: len(apiserver.watches()) == 2)
    assert discovery.errors_total == 0 and discovery.lists_total == 1


async def test_gone_status_relists_and_forgets_what_was_deleted_meanwhile(
    apiserver: FakeApiServer, run_discovery: StartDiscovery
) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    apiserver.upsert(endpoint_slice("vllm-2", [endpoint(B)]))
    discovery, seen = run_discovery(apiserver)
    assert await seen.next() == ReplicaSet.of(ready=[URL_A, URL_B])
    await eventually(lambda: apiserver.watch_count == 1)

    # while the watch is down: a slice is deleted, one added, and the history is compacted away
    await apiserver.drop_watches()
    apiserver.delete("vllm-2")
    apiserver.upsert(endpoint_slice("vllm-3", [endpoint(C)]))
    apiserver.compact()

    assert await seen.next() == ReplicaSet.of(ready=[URL_A, URL_C])
    assert discovery.lists_total == 2

    def versions() -> list[str]:
        return [w.params["resourceVersion"] for w in apiserver.watches()]

    await eventually(lambda: versions() == ["102", "102", "104"])  # resumed, 410 Gone, re-listed


async def test_gone_error_event_relists(apiserver: FakeApiServer, run_discovery: StartDiscovery) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    discovery, seen = run_discovery(apiserver)
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])
    await eventually(lambda: apiserver.watch_count == 1)
    apiserver.send_gone()
    await eventually(lambda: discovery.lists_total == 2)
    await eventually(lambda: apiserver.watch_count == 1)
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(B)]))
    assert await seen.next() == ReplicaSet.of(ready=[URL_B])
    assert discovery.errors_total == 0  # a single 410 is routine, not an error


async def test_bookmarks_advance_the_resource_version_silently(
    apiserver: FakeApiServer, run_discovery: StartDiscovery
) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    discovery, seen = run_discovery(apiserver)
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])
    await eventually(lambda: apiserver.watch_count == 1)
    apiserver.bookmark()
    await eventually(lambda: discovery.resource_version == str(apiserver.resource_version))
    await apiserver.drop_watches()
    await eventually(lambda: len(apiserver.watches()) == 2)
    assert apiserver.watches()[-1].params["resourceVersion"] == str(apiserver.resource_version)
    assert len(seen.sets) == 1


async def test_api_errors_back_off_and_recover(
    apiserver: FakeApiServer, run_discovery: StartDiscovery
) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    apiserver.list_status = 403
    discovery, seen = run_discovery(apiserver)
    await eventually(lambda: discovery.errors_total >= 3)
    assert "403" in (discovery.last_error or "")
    assert seen.sets == []
    apiserver.list_status = 200
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])


async def test_stale_view_is_drained_after_max_stale_then_restored(
    apiserver: FakeApiServer, run_discovery: StartDiscovery
) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A), endpoint(B)]))
    discovery, seen = run_discovery(apiserver, max_stale_s=0.3)
    assert await seen.next() == ReplicaSet.of(ready=[URL_A, URL_B])
    await eventually(lambda: apiserver.watch_count == 1)

    apiserver.down = True
    lost_at = time.monotonic()
    await apiserver.drop_watches()
    assert await seen.next() == ReplicaSet.of(draining=[URL_A, URL_B])
    assert time.monotonic() - lost_at >= 0.25

    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    apiserver.down = False
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])
    assert discovery.lists_total == 2  # recovered by a fresh list, not by resuming the old watch


async def test_without_a_staleness_bound_the_last_set_stays(
    apiserver: FakeApiServer, run_discovery: StartDiscovery
) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    discovery, seen = run_discovery(apiserver, max_stale_s=None)
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])
    await eventually(lambda: apiserver.watch_count == 1)
    apiserver.down = True
    await apiserver.drop_watches()
    await eventually(lambda: discovery.errors_total >= 5)
    await asyncio.sleep(0.1)
    assert discovery.current == ReplicaSet.of(ready=[URL_A]) and len(seen.sets) == 1


async def test_in_cluster_tls_and_rotated_token(tmp_path: Path, tls_dir: Path) -> None:
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(tls_dir / "server.crt", tls_dir / "server.key")
    apiserver = await FakeApiServer(ssl_context=server_tls).start()
    token = tmp_path / "token"
    token.write_text("token-1\n")
    (tmp_path / "namespace").write_text("ml")
    settings = KubernetesReplicas(
        service="vllm",
        port="http",
        token_path=str(token),
        ca_path=str(tls_dir / "ca.crt"),
        namespace_path=str(tmp_path / "namespace"),
        backoff_initial_s=0.01,
    )
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(apiserver.port)}
    seen = Collector()
    discovery = KubernetesEndpointSliceDiscovery.from_settings(settings, seen, environ)
    assert discovery.namespace == "ml"
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)], port=8123))
    task = asyncio.create_task(discovery.run())
    try:
        assert await seen.next() == ReplicaSet.of(ready=["http://127.0.0.11:8123"])
        await eventually(lambda: apiserver.watch_count == 1)
        assert apiserver.requests[0].headers["authorization"] == "Bearer token-1"
        token.write_text("token-2\n")  # the kubelet rotated the projected token
        await apiserver.drop_watches()
        await eventually(lambda: len(apiserver.watches()) == 2)
        assert apiserver.watches()[-1].headers["authorization"] == "Bearer token-2"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await apiserver.stop()


async def test_malformed_events_are_errors_and_resume(
    apiserver: FakeApiServer, run_discovery: StartDiscovery
) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    discovery, seen = run_discovery(apiserver)
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])
    await eventually(lambda: apiserver.watch_count == 1)
    apiserver.send_raw(b"<html>proxy error</html>\n")
    await eventually(lambda: discovery.errors_total == 1)
    assert "MalformedResponse" in (discovery.last_error or "")
    await eventually(lambda: apiserver.watch_count == 1)
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(B)]))
    assert await seen.next() == ReplicaSet.of(ready=[URL_B])
    assert discovery.lists_total == 1


async def test_a_failing_consumer_ends_the_source(apiserver: FakeApiServer) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))

    def broken(replicas: ReplicaSet) -> None:
        raise KeyError("registry bug")

    discovery = KubernetesEndpointSliceDiscovery(
        "ml",
        "kubernetes.io/service-name=vllm",
        8000,
        on_change=broken,
        access=ApiAccess(apiserver.url, False, lambda: None),
    )
    with pytest.raises(KeyError, match="registry bug"):
        await asyncio.wait_for(discovery.run(), 3)
    assert discovery.errors_total == 0


async def test_backoff_restarts_after_a_watch_that_delivered(
    apiserver: FakeApiServer, run_discovery: StartDiscovery
) -> None:
    apiserver.upsert(endpoint_slice("vllm-1", [endpoint(A)]))
    discovery, seen = run_discovery(apiserver, backoff_initial_s=0.05, backoff_max_s=10.0)
    assert await seen.next() == ReplicaSet.of(ready=[URL_A])
    # eight drops in a row: without the reset the 8th backoff would be 0.05 * 2**7 s (3.2 to 6.4 s)
    for ip, url in [(B, URL_B), (C, URL_C), (A, URL_A)] * 2 + [(B, URL_B), (C, URL_C)]:
        await eventually(lambda: apiserver.watch_count == 1)
        await apiserver.drop_watches()
        await eventually(lambda: apiserver.watch_count == 1, timeout_s=1.0)
        apiserver.upsert(endpoint_slice("vllm-1", [endpoint(ip)]))
        assert await seen.next(timeout_s=1.0) == ReplicaSet.of(ready=[url])
    assert discovery.errors_total == 8 and discovery.lists_total == 1
