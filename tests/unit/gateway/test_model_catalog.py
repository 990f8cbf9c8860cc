"""Several models per pool (issue 16, items 4 and 5): names declared and discovered, which replicas a name
routes to, aliases, fallbacks, the fleet's `/v1/models`, and the start-time checks on names."""

from __future__ import annotations

import random
from typing import Any

import pytest

from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import ConfigError, parse_settings
from gateway.upstream.model_catalog import ModelCatalog
from gateway.upstream.model_discovery import served_models
from gateway.upstream.registry import ReplicaRegistry
from router.keys import build_routing_request
from router.types import ReplicaView, RoutingRequest

BASE = "llama"


def _pool(model: str, replicas: int = 2, **extra: Any) -> dict[str, Any]:
    host = abs(hash(model)) % 200
    urls = [f"http://10.{host}.0.{i + 1}:8000" for i in range(replicas)]
    return {"model": model, "replicas": {"static": urls}, "policy": "least-load", **extra}


def _catalog(
    pools: list[dict[str, Any]], aliases: dict[str, str] | None = None
) -> tuple[ModelCatalog, ReplicaRegistry]:
    settings = parse_settings({"pools": pools, "model_aliases": aliases or {}})
    registry = ReplicaRegistry(settings, GatewayMetrics(), FakeClock(0.0), random.Random(1))
    return ModelCatalog(registry, settings.model_aliases), registry


def _listing(body: list[tuple[str, str | None]]) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "parent": parent} for name, parent in body],
    }


def test_a_replica_serves_the_base_model_whatever_its_engine_name_and_every_adapter_it_lists() -> None:
    listing = _listing([("meta-llama/Llama-3.1-8B", None), ("sql-lora", "meta-llama/Llama-3.1-8B")])
    assert served_models(listing, BASE, {BASE}) == {BASE, "sql-lora"}


def test_a_parentless_listed_model_counts_only_when_declared() -> None:
    listing = _listing([("base", None), ("other-model", None)])
    assert served_models(listing, BASE, {BASE}) == {BASE}
    assert served_models(listing, BASE, {BASE, "other-model"}) == {BASE, "other-model"}


@pytest.mark.parametrize(
    "body",
    [None, [], {"data": "x"}, {"data": [{"id": 3}]}, {"data": [{"object": "model"}]}, {"data": [{"id": ""}]}],
)
def test_a_body_that_is_not_a_model_list_is_not_read(body: object) -> None:
    assert served_models(body, BASE, {BASE}) is None


def test_discovered_adapters_route_only_to_the_replicas_that_list_them() -> None:
    catalog, registry = _catalog([_pool(BASE, models={"discover": True})])
    pool = registry.pools[BASE]
    first, _ = pool.replicas.values()
    assert catalog.resolve("sql-lora") is None, "unknown until a replica lists it"
    registry.set_replica_models(pool, first, frozenset({BASE, "sql-lora"}))
    served = catalog.resolve("sql-lora")
    assert served is not None and served.pool is pool and served.upstream_name == "sql-lora"
    request = build_routing_request("sql-lora", "hello")
    decision = pool.policy.decide(request, pool.snapshot())
    assert decision is not None and decision.replica_id == first.replica_id
    for _ in range(5):  # the base model goes to either
        assert pool.policy.decide(build_routing_request(BASE, "x"), pool.snapshot()) is not None
    assert pool.has_eligible_replica("sql-lora")
    registry.set_active_health(first, False, None)
    assert not pool.has_eligible_replica("sql-lora") and pool.has_eligible_replica(BASE)
    assert pool.policy.decide(request, pool.snapshot()) is None


def test_an_adapter_leaves_the_pool_with_its_last_replica() -> None:
    catalog, registry = _catalog([_pool(BASE, models={"discover": True})])
    pool = registry.pools[BASE]
    first, second = pool.replicas.values()
    registry.set_replica_models(pool, first, frozenset({BASE, "a"}))
    registry.set_replica_models(pool, second, frozenset({BASE, "a", "b"}))
    assert pool.discovered_models == {"a", "b"}
    registry.set_replica_models(pool, second, frozenset({BASE, "a"}))
    assert pool.discovered_models == {"a"} and catalog.resolve("b") is None


def test_declared_names_are_served_by_every_replica_until_discovery_says_otherwise() -> None:
    _, registry = _catalog([_pool(BASE, models={"names": ["chat-lora"], "discover": True})])
    pool = registry.pools[BASE]
    assert all(r.models == {BASE, "chat-lora"} for r in pool.replicas.values())
    first, second = pool.replicas.values()
    registry.set_replica_models(pool, first, frozenset({BASE}))
    request = build_routing_request("chat-lora", "x")
    assert [v.replica_id for v in pool.snapshot() if v.serves(request.model)] == [second.replica_id]


def test_without_discovery_every_replica_serves_every_declared_name() -> None:
    catalog, registry = _catalog([_pool(BASE, models={"names": ["chat-lora"]})])
    pool = registry.pools[BASE]
    assert all(r.models is None for r in pool.replicas.values())
    assert all(view.serves("chat-lora") for view in pool.snapshot())
    served = catalog.resolve("chat-lora")
    assert served is not None and served.pool is pool


def test_an_alias_resolves_to_its_target_and_the_engine_gets_the_target_or_the_upstream_name() -> None:
    pools = [_pool(BASE, upstream_model="meta-llama/Llama-3.1-8B", models={"names": ["sql-lora"]})]
    catalog, _ = _catalog(pools, {"fast": BASE, "sql": "sql-lora"})
    fast, sql, base = catalog.resolve("fast"), catalog.resolve("sql"), catalog.resolve(BASE)
    assert fast is not None and fast.name == BASE and fast.upstream_name == "meta-llama/Llama-3.1-8B"
    assert sql is not None and sql.name == "sql-lora" and sql.upstream_name == "sql-lora"
    assert sql.requested == "sql", "served under its target, asked for by its alias"
    assert base is not None and base.requested == base.name


def test_the_prefix_key_of_an_adapter_is_its_own() -> None:
    text = "a long shared system prompt " * 40
    base, adapter = build_routing_request(BASE, text), build_routing_request("sql-lora", text)
    assert base.prefix_key != adapter.prefix_key
    assert not set(base.prefix_hashes) & set(adapter.prefix_hashes)


def test_models_lists_pools_names_adapters_with_their_parent_and_aliases_of_listed_names() -> None:
    pools = [_pool(BASE, models={"names": ["chat-lora"], "discover": True}), _pool("small", replicas=1)]
    catalog, registry = _catalog(pools, {"fast": "small", "chat": "chat-lora"})
    big = registry.pools[BASE]
    first = next(iter(big.replicas.values()))
    registry.set_replica_models(big, first, frozenset({BASE, "chat-lora", "sql-lora"}))
    listed = {entry["id"]: entry for entry in catalog.listing(created=1)}
    assert list(listed) == [BASE, "chat-lora", "sql-lora", "small", "fast", "chat"]
    assert listed["sql-lora"]["parent"] == BASE and "parent" not in listed["chat-lora"]
    small = next(iter(registry.pools["small"].replicas.values()))
    registry.set_active_health(small, False, None)
    assert [entry["id"] for entry in catalog.listing(created=1)] == [BASE, "chat-lora", "sql-lora", "chat"]


def test_fallbacks_are_the_listed_pools_that_serve_the_endpoint_in_order() -> None:
    pools = [
        _pool(BASE, fallback=["chat-only", "small"]),
        _pool("small", replicas=1),
        _pool("chat-only", replicas=1, endpoints=["chat"]),
    ]
    catalog, registry = _catalog(pools)
    big = registry.pools[BASE]
    assert [s.pool.model for s in catalog.fallbacks(big, "chat")] == ["chat-only", "small"]
    assert [s.pool.model for s in catalog.fallbacks(big, "embeddings")] == ["small"]
    assert all(s.name == s.pool.model for s in catalog.fallbacks(big, "chat"))


@pytest.mark.parametrize(
    ("pools", "aliases", "error"),
    [
        ([_pool(BASE, models={"names": ["x"]}), _pool("x")], {}, "'x' is configured by more than one pool"),
        ([_pool(BASE, models={"names": ["x", "x"]})], {}, "model names must be distinct"),
        ([_pool(BASE)], {BASE: BASE}, "'llama' is already served by pool 'llama'"),
        ([_pool(BASE)], {"a": "nowhere"}, "no pool serves 'nowhere'"),
        ([_pool(BASE, fallback=[BASE])], {}, "fallback 'llama' is not another pool's model"),
        ([_pool(BASE, fallback=["ghost"])], {}, "fallback 'ghost' is not another pool's model"),
        ([_pool(BASE, fallback=["s", "s"]), _pool("s")], {}, "fallback lists a pool twice"),
        ([_pool(BASE, models={"adapters": {"a": "/a"}})], {}, "needs discover: true"),
        (
            [_pool(BASE, models={"names": ["a"], "adapters": {"a": "/a"}, "discover": True})],
            {},
            "also in names",
        ),
        (
            [_pool(BASE, models={"adapters": {"x": "/x"}, "discover": True}), _pool("x")],
            {},
            "more than one pool",
        ),
    ],
)
def test_conflicting_names_fail_the_start_naming_them(
    pools: list[dict[str, Any]], aliases: dict[str, str], error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_settings({"pools": pools, "model_aliases": aliases})


def test_eligibility_needs_the_replica_to_serve_the_requested_name() -> None:
    adapter_only = ReplicaView("a", "http://a", models=frozenset({BASE, "sql-lora"}))
    base_only = ReplicaView("b", "http://b", models=frozenset({BASE}))
    unknown = ReplicaView("c", "http://c")
    request = RoutingRequest(model="sql-lora")
    assert [v.serves(request.model) for v in (adapter_only, base_only, unknown)] == [True, False, True]
