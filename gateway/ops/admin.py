"""Admin API under `/admin/`: replicas with state and load, drain/undrain, current config.

Never open by default: the API exists only when the environment variable named by
`admin.api_key_env` (default `LLM_GATEWAY_ADMIN_KEY`) holds a key; otherwise every admin route is a
404. Requests must carry `Authorization: Bearer <key>` (compared in constant time), else 401.

A draining replica gets no new requests; its in-flight requests finish. Its status reports the
remaining in-flight count and `drained: true` once that reaches zero.

`POST /admin/replicas/{id}/preempt` with `{"deadline_s": S, "margin_s": M}` (M default 2) is a
preemption notice: the replica drains now and whatever still runs on it at S − M seconds is moved to
other replicas — started streams continued, the rest retried (`gateway.proxy.preemption`). The answer
carries the replica's status and `cut_in_s`. A bad body is a 400 `bad_request` naming the field.

Each replica's status also says whether it is `ejected` (breaker open or half-open while neither down
nor draining: what the pool's ejection budget counts) and whether its pool is in panic mode
(`pool_panic`: routing ignores breakers; `eligible` then reflects that). See
`gateway.upstream.registry`.

`GET /admin/config` shows the settings in force with every credential redacted (`core.redaction`).
"""

from __future__ import annotations

import hmac
import os
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from core.clock import Clock
from core.redaction import redact
from gateway.base.errors import RouteNotFound, Unauthorized
from gateway.config.settings import Settings
from gateway.proxy.preemption import DEFAULT_MARGIN_S, Preemption
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.replica import Replica


def _replica_status(pool: Pool, replica: Replica, now_s: float) -> dict[str, Any]:
    engine = replica.engine
    return {
        "id": replica.replica_id,
        "url": replica.url,
        "model": pool.model,
        "eligible": replica.routable_at(now_s),
        "healthy": replica.healthy_at(now_s),
        "active_up": replica.active_up,
        "draining": replica.is_draining,
        "operator_draining": replica.draining,
        "discovery_draining": replica.discovery_draining,
        "drained": replica.is_draining and replica.inflight_requests == 0,
        "breaker": str(replica.breaker.state),
        "ejected": replica.is_ejected(now_s),
        "pool_panic": pool.panic,
        "inflight_requests": replica.inflight_requests,
        "inflight_tokens": replica.inflight_tokens,
        "max_concurrency": replica.max_concurrency,
        "engine": None
        if engine is None
        else {
            "running": engine.running,
            "waiting": engine.waiting,
            "kv_usage_ratio": engine.kv_usage_ratio,
            "age_s": engine.age_s,
            "stale": engine.stale,
        },
    }


class PreemptNotice(BaseModel):
    """`POST /admin/replicas/{id}/preempt` body: the replica goes away in `deadline_s` seconds; its
    tries still running `margin_s` before that are moved elsewhere (`gateway.proxy.preemption`)."""

    model_config = ConfigDict(extra="forbid")

    deadline_s: float = Field(ge=0, allow_inf_nan=False)
    margin_s: float = Field(DEFAULT_MARGIN_S, ge=0, allow_inf_nan=False)


def build_admin_router(
    settings: Settings, registry: ReplicaRegistry, clock: Clock, preemption: Preemption
) -> APIRouter:
    def authorize(request: Request) -> None:
        key = os.environ.get(settings.admin.api_key_env)
        if not key:
            raise RouteNotFound(f"no route {request.method} {request.url.path}")
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise Unauthorized("admin API: missing or invalid admin key")

    router = APIRouter(prefix="/admin", dependencies=[Depends(authorize)])

    def statuses(replica_id: str | None = None) -> list[dict[str, Any]]:
        now_s = clock.now_s()
        for pool in registry.pools.values():
            pool.in_panic()  # fresh: panic may have flipped with time (a hold or a cooldown ended)
        found = [
            _replica_status(pool, replica, now_s)
            for pool in registry.pools.values()
            for replica in pool.replicas.values()
            if replica_id is None or replica.replica_id == replica_id
        ]
        if replica_id is not None and not found:
            raise RouteNotFound(f"no replica {replica_id!r}")
        return found

    def set_draining(replica_id: str, draining: bool) -> list[dict[str, Any]]:
        replicas = registry.find(replica_id)
        if not replicas:
            raise RouteNotFound(f"no replica {replica_id!r}")
        for replica in replicas:
            registry.set_draining(replica, draining)
        return statuses(replica_id)

    @router.get("/replicas")
    async def list_replicas() -> dict[str, Any]:
        return {"replicas": statuses()}

    @router.get("/replicas/{replica_id}")
    async def get_replica(replica_id: str) -> dict[str, Any]:
        return {"replicas": statuses(replica_id)}

    @router.post("/replicas/{replica_id}/drain")
    async def drain(replica_id: str) -> dict[str, Any]:
        return {"replicas": set_draining(replica_id, True)}

    @router.post("/replicas/{replica_id}/undrain")
    async def undrain(replica_id: str) -> dict[str, Any]:
        return {"replicas": set_draining(replica_id, False)}

    @router.post("/replicas/{replica_id}/preempt")
    async def preempt(replica_id: str, notice: PreemptNotice) -> dict[str, Any]:
        replicas = registry.find(replica_id)
        if not replicas:
            raise RouteNotFound(f"no replica {replica_id!r}")
        cut_in_s = 0.0
        for replica in replicas:
            cut_in_s = preemption.notify(replica, notice.deadline_s, notice.margin_s)
        return {"replicas": statuses(replica_id), "cut_in_s": cut_in_s}

    @router.get("/config")
    async def config() -> dict[str, Any]:
        """The settings in force, credentials redacted (`core.redaction`: URL passwords, header values)."""
        dumped: dict[str, Any] = redact(settings.model_dump(mode="json"))
        return dumped

    return router
