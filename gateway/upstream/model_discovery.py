"""Model discovery: read each replica's `/v1/models` and learn the LoRA adapters (and declared models)
it serves (`models.discover`; settings and routing rules in `gateway.config.model_settings`).

One `ModelDiscovery` per pool, one asyncio task: every `refresh_s` it reads every current replica
concurrently (each bounded by `timeout_s`, with the pool's engine key when it has one — vLLM's
`--api-key` guards `/v1/models` too) and hands what it read to the registry
(`ReplicaRegistry.set_replica_models`). A failed read (connect, timeout, status, a body that is not an
OpenAI model list) changes nothing: the replica keeps its last known list, and the failure is counted
in `llm_gateway_model_discovery_errors_total{replica}` (`replica="loop"`: the loop itself failed, logged
with its stack trace). Health is the health checker's business, not
this loop's: a replica that cannot answer here is not marked down.

`served_models` is the pure rule: the pool's model always (the engine's base model, whatever its
engine-side name), every entry with a `parent` (an adapter, vLLM's listing), and parentless entries
named in `models.names`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping

import httpx

from core.tasks import cancel_and_wait
from gateway.upstream.pool import Pool
from gateway.upstream.replica import Replica

_log = logging.getLogger(__name__)

LOOP_ERROR_LABEL = "loop"
"""The `replica` label of `model_discovery_errors_total` when the loop itself failed (a bug), not a read."""


def served_models(listing: object, pool_model: str, declared: Collection[str]) -> frozenset[str] | None:
    """The client-facing names a replica serves according to its `/v1/models` body (module docstring),
    or None when the body is not an OpenAI model list."""
    if not isinstance(listing, Mapping):
        return None
    data = listing.get("data")
    if not isinstance(data, list):
        return None
    names = {pool_model}
    for entry in data:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("id"), str) or not entry["id"]:
            return None
        name, parent = entry["id"], entry.get("parent")
        if (isinstance(parent, str) and parent) or name in declared:
            names.add(name)
    return frozenset(names)


class ModelDiscovery:
    """Reads one pool's replicas' model lists (module docstring)."""

    def __init__(
        self,
        pool: Pool,
        client: httpx.AsyncClient,
        publish: Callable[[Pool, Replica, frozenset[str]], None],
        *,
        engine_key: str | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._pool = pool
        self._client = client
        self._publish = publish
        self._headers = {} if engine_key is None else {"authorization": f"Bearer {engine_key}"}
        self._on_error = on_error
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the loop (idempotent); the first read happens at once."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"model-discovery-{self._pool.model}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait([task])

    async def poll_once(self) -> None:
        """Read every current replica once, concurrently, and publish what was read."""
        replicas = list(self._pool.replicas.values())
        await asyncio.gather(*(self._read(replica) for replica in replicas))

    async def _run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # a bug, not a failed read: keep discovering, say it loudly and count it
                _log.exception("model discovery of pool %s failed", self._pool.model)
                if self._on_error is not None:
                    self._on_error(LOOP_ERROR_LABEL)
            await asyncio.sleep(self._pool.settings.models.refresh_s)

    async def _read(self, replica: Replica) -> None:
        settings = self._pool.settings.models
        before = replica.models
        try:
            async with asyncio.timeout(settings.timeout_s):
                response = await self._client.get(
                    replica.url + "/v1/models", headers=self._headers, timeout=settings.timeout_s
                )
            if response.status_code != 200:
                raise ValueError(f"status {response.status_code}")
            names = served_models(response.json(), self._pool.model, self._pool.declared_models)
            if names is None:
                raise ValueError("not an OpenAI model list")
        except (TimeoutError, httpx.HTTPError, ValueError) as exc:
            _log.debug("model discovery: %s: %s", replica.replica_id, exc)
            if self._on_error is not None:
                self._on_error(replica.replica_id)
            return
        # not removed while it was read, and no adapter loaded meanwhile (this answer may predate it;
        # the next read sees it)
        if replica.replica_id in self._pool.replicas and replica.models is before:
            self._publish(self._pool, replica, names)
