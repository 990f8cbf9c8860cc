"""The start-time checks on client-facing model names across pools: each name is served by one pool,
aliases point at a served name and shadow none, fallbacks name other pools.

Names learned later from the replicas (`models.discover`) cannot be checked here: a discovered name
that another pool already serves stays with that pool (`gateway.upstream.model_catalog`), and with a
discovering pool an alias may point at a name no replica lists yet (a 404 `model_not_found` until
one does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.config.pool_settings import PoolSettings


def check_model_names(pools: Sequence[PoolSettings], aliases: Mapping[str, str]) -> None:
    """Raise `ValueError` naming the first conflict (see the module docstring)."""
    owner: dict[str, str] = {}
    for pool in pools:
        for name in (pool.model, *pool.models.names, *pool.models.adapters):
            if name in owner:
                raise ValueError(f"model {name!r} is configured by more than one pool")
            owner[name] = pool.model
    discovering = any(pool.models.discover for pool in pools)
    for alias, target in aliases.items():
        if alias in owner:
            raise ValueError(f"model_aliases: {alias!r} is already served by pool {owner[alias]!r}")
        if target not in owner and not discovering:
            raise ValueError(
                f"model_aliases: {alias!r} -> {target!r}: no pool serves {target!r} (a pool's model or "
                "one of its models.names; or an adapter, with a pool that has models.discover)"
            )
    pool_models = {pool.model for pool in pools}
    for pool in pools:
        for fallback in pool.fallback:
            if fallback == pool.model or fallback not in pool_models:
                raise ValueError(
                    f"pools: {pool.model}: fallback {fallback!r} is not another pool's model "
                    f"(pools: {', '.join(sorted(pool_models))})"
                )
        if len(set(pool.fallback)) != len(pool.fallback):
            raise ValueError(f"pools: {pool.model}: fallback lists a pool twice")
