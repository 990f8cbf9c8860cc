"""One discovery source per pool, chosen by its `replicas` settings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from gateway.config.discovery_settings import ReplicaSources
from gateway.upstream.discovery.dns import DnsDiscovery, Resolver
from gateway.upstream.discovery.kubernetes import KubernetesEndpointSliceDiscovery
from gateway.upstream.discovery.types import DiscoverySource, Emitter, OnChange, ReplicaSet

logger = logging.getLogger(__name__)


class StaticDiscovery:
    """A fixed list: emits it once (all `ready`) and then waits to be cancelled."""

    def __init__(self, urls: list[str], on_change: OnChange) -> None:
        self._set = ReplicaSet.of(ready=urls)
        self._emitter = Emitter(on_change)

    @property
    def current(self) -> ReplicaSet | None:
        return self._emitter.last

    async def run(self) -> None:
        self._emitter.emit(self._set)
        await asyncio.Event().wait()


def build_discovery(
    sources: ReplicaSources,
    on_change: OnChange,
    *,
    environ: Mapping[str, str] | None = None,
    resolver: Resolver | None = None,
) -> DiscoverySource:
    """The source for one pool; raises `KubeConfigError` when Kubernetes access cannot be set up."""
    if sources.dns is not None:
        return DnsDiscovery.from_settings(sources.dns, on_change, resolver)
    if sources.kubernetes is not None:
        return KubernetesEndpointSliceDiscovery.from_settings(sources.kubernetes, on_change, environ)
    return StaticDiscovery(sources.static, on_change)


class DiscoveryRunner:
    """Runs one source as one asyncio task, with the `start()` / `stop()` shape of the app's other loops.

    A source only ends by cancellation or when `on_change` raised (a registry bug): that is logged with
    its stack trace and kept in `failure`; the last emitted membership stays in force.
    """

    def __init__(self, source: DiscoverySource, name: str) -> None:
        self.source = source
        self.name = name
        self._task: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.source.run(), name=f"discovery:{self.name}")
            self._task.add_done_callback(self._finished)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # its failure, if any, was logged by `_finished`

    def _finished(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.failure = task.exception()
            logger.error("discovery %s stopped", self.name, exc_info=self.failure)
