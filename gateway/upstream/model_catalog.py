"""Which pool serves a client-facing model name, under which name, and what the engine is sent.

A name resolves, in order: through `model_aliases` to its target; to the pool whose `model` it is; to
the pool that declares it (`models.names`) or whose replicas listed it (`models.discover`,
`gateway.upstream.model_discovery`) or may load it (`models.adapters`) — configured names first,
then discovered ones, pools in config order, so a discovered name another pool already serves stays
with that pool. Unknown: None (the handler's 404 `model_not_found`).

The engine is sent the served name, except that the pool's own model goes out as its
`upstream_model` when one is set; the body is rewritten only when that differs from what the client
sent (`gateway.api.request_parsing.rewrite_body`).

`/v1/models` through the gateway lists what the fleet serves now: each client-facing pool with an
eligible replica, then its declared names (config order) and the adapters its eligible replicas list
or it may load (sorted, with `parent`, as vLLM lists them), then the aliases of listed names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.upstream.pool import Pool
from gateway.upstream.registry import ReplicaRegistry
from router.eligibility import any_routable


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One request's model: the pool, the name it is served under, the name the client sent."""

    pool: Pool
    name: str
    requested: str

    @property
    def upstream_name(self) -> str:
        """The model name the engine is sent: the pool's `upstream_model` for its own model, else the
        served name (an adapter, a declared model, an alias's target)."""
        if self.name == self.pool.model:
            return self.pool.settings.upstream_model or self.name
        return self.name

    @property
    def lora_adapter(self) -> bool:
        """A LoRA adapter: listed with a parent by a replica, or loadable (`models.adapters`). A
        declared name (`models.names`) may be an adapter or a model of a multi-model server: not known."""
        return self.name in self.pool.discovered_models or self.name in self.pool.loadable_models


class ModelCatalog:
    """Resolves names to pools (module docstring); reads the registry's current state every time."""

    def __init__(self, registry: ReplicaRegistry, aliases: Mapping[str, str]) -> None:
        self._registry = registry
        self._aliases = dict(aliases)

    def resolve(self, requested: str) -> ServedModel | None:
        """The pool and served name of `requested`, or None when no pool serves it."""
        name = self._aliases.get(requested, requested)
        pool = self._registry.pool(name)
        if pool is None:
            pools = self._client_pools()
            configured = (p for p in pools if name in p.declared_models or name in p.loadable_models)
            pool = next(configured, None) or next((p for p in pools if name in p.discovered_models), None)
        return None if pool is None else ServedModel(pool, name, requested)

    def pool(self, model: str) -> Pool | None:
        """The client-facing pool whose model is `model` (no alias or other name resolved)."""
        return self._registry.pool(model)

    def fallbacks(self, pool: Pool, endpoint: str) -> list[ServedModel]:
        """`pool`'s `fallback` pools (names checked at start) that serve `endpoint`, in order, each
        under its own model."""
        found = (self._registry.pool(model) for model in pool.settings.fallback)
        return [
            ServedModel(p, p.model, p.model)
            for p in found
            if p is not None and endpoint in p.settings.served_endpoints
        ]

    def listing(self, created: int) -> list[dict[str, object]]:
        """The `data` of `/v1/models` (module docstring), pools in config order."""
        data: list[dict[str, object]] = []
        listed: set[str] = set()
        for pool in self._client_pools():
            views = pool.snapshot()  # one snapshot per pool, every name checked against it
            if not any_routable(views):
                continue
            adapters = sorted(pool.discovered_models | pool.loadable_models)
            for name in [pool.model, *pool.settings.models.names, *adapters]:
                loadable = name in pool.loadable_models
                if name in listed or not (loadable or any_routable(views, name)):
                    continue
                entry: dict[str, object] = {
                    "id": name, "object": "model", "created": created, "owned_by": "llm-gateway"
                }  # fmt: skip
                if name in pool.discovered_models or loadable:
                    entry["parent"] = pool.model
                data.append(entry)
                listed.add(name)
        for alias, target in self._aliases.items():
            if target in listed:
                data.append({"id": alias, "object": "model", "created": created, "owned_by": "llm-gateway"})
        return data

    def _client_pools(self) -> list[Pool]:
        return [p for p in self._registry.pools.values() if p.client_facing]
