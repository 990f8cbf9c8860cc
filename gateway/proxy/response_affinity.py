"""State affinity for the Responses API: a stored response is served only by the replica that holds it.

Engines keep stored responses in memory, so a request with `previous_response_id` and every
`/v1/responses/{id}` call must reach the replica that produced the id. The gateway remembers the replica
of every response id it relays (`remember`, after the response: the id from the non-streamed body or the
stream's `response.created` event) in the `ResponseState` (`gateway.proxy.stores.response_state`; Redis when
configured, so every instance agrees), and pins such requests to it (`others`, then `pin`): routing
may pick that one replica only (every other replica of the pool is excluded, retries included; the
decision's branch is `pinned`), admission and timers as for any request. `remember` runs just before
the response's last byte (the reply's `before_end` hook), so a client that chains on the id at once,
through any instance, finds the record. A `DELETE /v1/responses/{id}` the engine answered with a 2xx
forgets the id (`remember` again, reading the relayed status), so a later call on it is the gateway's
own 404 `response_not_found`, never forwarded; a refused or failed delete keeps it.

A stored response belongs to the tenant whose request produced it. With tenants configured, every
record is kept under its owner (`stored_key`: a digest of the tenant's name, then the id), and every
access — `previous_response_id`, retrieve, delete, cancel, input items — looks the id up under the
caller's tenant, so another tenant's id is exactly an unknown one: 404 `response_not_found`, the same
answer and message, nothing sent upstream. Without tenants (every request is the anonymous tenant) the
key is the id itself, as before tenants existed.

Failures are explicit, never a silent answer from a replica without the state:
- an id with no record (never relayed by the gateway, its record expired, or another tenant's) → 404
  `response_not_found`;
- a record whose replica has left the pool, or is not routable (down, draining, breaker open), or whose
  pool is not the one asked → 404 `response_state_lost` (the reason header says which).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from admission.tenants import Tenant, TenantDirectory
from gateway.api.response_calls import response_call
from gateway.base.errors import ResponseNotFound, ResponseStateLost
from gateway.proxy.context import RequestContext
from gateway.proxy.reply import Reply
from gateway.proxy.stores.response_state import ResponseLocation, ResponseState
from gateway.upstream.registry import Pool
from router.eligibility import is_routable


def stored_key(owner: str | None, response_id: str) -> str:
    """The response state's key of `response_id` owned by the tenant named `owner`: the id itself
    without an owner (no tenants configured), else the first 16 hex digits of the name's sha256, ':',
    the id (fixed length: no two owners' keys can collide, whatever their names or the ids hold)."""
    if owner is None:
        return response_id
    return hashlib.sha256(owner.encode()).hexdigest()[:16] + ":" + response_id


class ResponseAffinity:
    """Remembers where responses live and pins requests that need one (module docstring). With
    tenants configured in `tenants`, each record belongs to the tenant that produced it."""

    def __init__(self, state: ResponseState, tenants: TenantDirectory | None = None) -> None:
        self._state = state
        self._by_tenant = tenants is not None and tenants.tenants_configured

    def _key(self, tenant: Tenant, response_id: str) -> str:
        return stored_key(tenant.name if self._by_tenant else None, response_id)

    async def locate(self, tenant: Tenant, response_id: str) -> ResponseLocation:
        """The location of `tenant`'s `response_id`, or 404 `response_not_found` (also when the id is
        another tenant's: the same answer as for an unknown id)."""
        location = await self._state.get(self._key(tenant, response_id))
        if location is None:
            raise ResponseNotFound(
                f"the gateway knows no stored response {response_id!r} (never produced through it, "
                "or its record expired)"
            )
        return location

    def others(self, pool: Pool, response_id: str, location: ResponseLocation) -> frozenset[str]:
        """The replicas of `pool` a request on `response_id` must not reach (all but its holder), or 404
        `response_state_lost` when the holder cannot take it."""
        if location.model != pool.model:
            raise ResponseStateLost(
                f"response {response_id!r} is held by pool {location.model!r}, not by pool {pool.model!r}"
            )
        views = {view.replica_id: view for view in pool.snapshot()}
        view = views.get(location.replica_id)
        if view is None:
            raise ResponseStateLost(
                f"response {response_id!r} was stored on replica {location.replica_id}, which has left "
                f"pool {pool.model!r}: its state is lost"
            )
        if not is_routable(view):
            raise ResponseStateLost(
                f"response {response_id!r} is stored on replica {location.replica_id} of pool "
                f"{pool.model!r}, which is not routable now (down, draining or circuit-open)"
            )
        return frozenset(rid for rid in views if rid != location.replica_id)

    @staticmethod
    def pin(ctx: RequestContext, others: frozenset[str]) -> RequestContext:
        """`ctx` routed only to the holder: `others` (from `others`) excluded, retries included."""
        return replace(ctx, routing=replace(ctx.routing, exclude=others, pinned=True))

    async def remember(self, ctx: RequestContext, reply: Reply) -> None:
        """Record the replica of the response id the reply carried (if any); after a successful
        `DELETE /v1/responses/{id}` (relayed status 2xx), forget that id instead."""
        if ctx.parsed.method == "DELETE":
            call = response_call(ctx.parsed.upstream_path.partition("?")[0])
            if call is not None and reply.status is not None and 200 <= reply.status < 300:
                await self._state.delete(self._key(ctx.tenant, call.response_id))
            return
        if reply.response_id is None or reply.decision is None:
            return
        location = ResponseLocation(ctx.model, reply.decision.replica_id)
        await self._state.put(self._key(ctx.tenant, reply.response_id), location)
