"""Serving a request that carries an `Idempotency-Key`: replayed when the same request completed before,
else served and its answer recorded.

Only non-streamed requests are replayed; a streamed one, or one without a key, is simply served. The
record's scope is the method and upstream path (each `/v1/responses/{id}` call is its own), the model,
and who sent it: the tenant when tenants are configured (whatever its key), else the `Authorization`
value. A claim (waiting for a running leader first; 400 when the key came with another body) that finds
a completed record replays its status, headers and body (`replay_headers`; the request's own id)
without serving; otherwise the request is served with its answer recorded, and the record is completed
with it — or with nothing when serving failed, so a retry serves again
(`gateway.proxy.stores.idempotency`).
"""

from __future__ import annotations

from admission.tenants import TenantDirectory
from gateway.api.asgi_io import send_response
from gateway.proxy.context import RequestContext
from gateway.proxy.reply import Reply
from gateway.proxy.serving import RequestServer
from gateway.proxy.stores.idempotency import (
    IdempotencyStore,
    ResponseRecorder,
    StoredResponse,
    body_digest,
    idempotency_scope,
    replay_headers,
)


class IdempotentServing:
    """Serves through `server`, replaying and recording with `store` (see the module docstring); with
    `tenants` configured, a record is its tenant's."""

    def __init__(self, server: RequestServer, store: IdempotencyStore, tenants: TenantDirectory) -> None:
        self._server = server
        self._store = store
        self._tenants = tenants

    async def serve(self, ctx: RequestContext, reply: Reply) -> None:
        if not ctx.idempotency_key or ctx.stream:
            await self._server.serve(ctx, reply)
            return
        tenants = self._tenants.tenants_configured  # with tenants a record is the tenant's, whatever its key
        scoped = idempotency_scope(  # method and upstream path: each `/v1/responses/{id}` call is its own
            f"{ctx.parsed.method} {ctx.parsed.upstream_path}",
            ctx.model,
            f"tenant:{ctx.tenant.name}" if tenants else ctx.authorization,
            ctx.idempotency_key,
        )
        stored = await self._store.claim(scoped, body_digest(ctx.parsed.raw))
        if stored is not None:
            if reply.watcher is not None:
                reply.watcher.disarm()
            await send_response(
                reply.send, stored.status, replay_headers(stored, reply.request_id), stored.body
            )
            return
        recorder = ResponseRecorder(reply.send)
        reply.send = recorder
        outcome: StoredResponse | None = None
        try:
            await self._server.serve(ctx, reply)
            outcome = recorder.stored()
        finally:
            await self._store.complete(scoped, outcome)
