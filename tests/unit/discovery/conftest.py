from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.upstream.discovery.k8s_auth import ApiAccess
from gateway.upstream.discovery.kubernetes import KubernetesEndpointSliceDiscovery
from gateway.upstream.discovery.types import ReplicaSet
from tests.unit.discovery.fake_apiserver import NAMESPACE, SERVICE, FakeApiServer

WAIT_S = 3.0


class Collector:
    """Receives `on_change` calls; `await next()` returns the next emitted set."""

    def __init__(self) -> None:
        self.sets: list[ReplicaSet] = []
        self._queue: asyncio.Queue[ReplicaSet] = asyncio.Queue()

    def __call__(self, replicas: ReplicaSet) -> None:
        self.sets.append(replicas)
        self._queue.put_nowait(replicas)

    async def next(self, timeout_s: float = WAIT_S) -> ReplicaSet:
        return await asyncio.wait_for(self._queue.get(), timeout_s)

    def pending(self) -> int:
        return self._queue.qsize()


StartDiscovery = Callable[..., tuple[KubernetesEndpointSliceDiscovery, Collector]]

_SERVER_EXTENSIONS = (
    "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
    "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n"
)


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA (`ca.crt`) and a certificate for 127.0.0.1 signed by it (`server.crt`, `server.key`),
    made with the openssl CLI so that no private key lives in the repository."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is needed to make test certificates")
    out = tmp_path_factory.mktemp("tls")
    (out / "ext.cnf").write_text(_SERVER_EXTENSIONS)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    commands = [
        ["req", "-x509", *ec, "-days", "2", "-subj", "/CN=llm-gateway test CA", "-keyout", "ca.key",
         "-out", "ca.crt", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", *ec, "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr"],
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
         "-days", "2", "-extfile", "ext.cnf", "-out", "server.crt"],
    ]  # fmt: skip
    for command in commands:
        subprocess.run([openssl, *command], cwd=out, check=True, capture_output=True, timeout=30)
    return out


@pytest.fixture
async def apiserver() -> AsyncIterator[FakeApiServer]:
    server = await FakeApiServer().start()
    yield server
    await server.stop()


@pytest.fixture
async def run_discovery() -> AsyncIterator[StartDiscovery]:
    tasks: list[asyncio.Task[None]] = []

    def start(server: FakeApiServer, **kwargs: Any) -> tuple[KubernetesEndpointSliceDiscovery, Collector]:
        collector = Collector()
        options: dict[str, Any] = {
            "backoff_initial_s": 0.01,
            "backoff_max_s": 0.05,
            "rng": random.Random(1),
            "access": ApiAccess(server.url, False, lambda: "test-token"),
        }
        options.update(kwargs)
        discovery = KubernetesEndpointSliceDiscovery(
            NAMESPACE, f"kubernetes.io/service-name={SERVICE}", 8000, on_change=collector, **options
        )
        tasks.append(asyncio.create_task(discovery.run()))
        return discovery, collector

    yield start
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.005)
