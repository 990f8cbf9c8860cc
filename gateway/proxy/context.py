"""The frozen context of one request, parsed once at the edge and read by every later step.

`build_context` runs after the body is parsed and the pool found: it fixes everything the serve
path needs to know about the request and never changes afterwards — who (tenant, priority class),
what (the parsed body, its pool), where it may go (the `RoutingRequest`: prompt block hashes, session
key, token estimate), and how it is sent (the upstream body and headers, its timers). A bad timer
override header is a 400 `bad_request` here, before admission charges anything.

What changes while the request runs lives elsewhere: the client side in `gateway.proxy.reply.Reply`,
one upstream try in `gateway.proxy.attempt.Attempt`, the held slot and tenant pass in the admission
`Ticket`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from admission.tenants import Tenant
from gateway.api.asgi_io import Scope, header
from gateway.api.request_parsing import ParsedRequest, rewrite_body
from gateway.base.surface import ApiSurface
from gateway.observability.request_record import NO_RECORD, RequestRecord
from gateway.proxy.slo_headers import SLO_TPOT_HEADER, SLO_TTFT_HEADER, request_slo
from gateway.proxy.timers import IDLE_HEADER, TTFT_HEADER, RequestTimers, request_timers
from gateway.upstream.model_catalog import ServedModel
from gateway.upstream.registry import Pool
from router.keys import build_routing_request, session_key_of
from router.types import CapTier, RoutingRequest

FORWARDED_HEADERS = (b"accept", b"user-agent", b"traceparent", b"tracestate")
"""Client headers passed upstream as they are (beside content-type and the request id). Never the
client's credentials: its `Authorization` is the gateway's tenant key; the engines get the pool's own
key (`engine_api_key_env`) or none. The client's W3C trace context goes upstream unchanged when the
gateway does not trace; when it does, each try replaces it with its own span's (`RequestRecord.
upstream_headers`), so the engine's spans join the request's trace either way."""
SURFACE_HEADERS: dict[ApiSurface, tuple[bytes, ...]] = {
    ApiSurface.ANTHROPIC: (b"anthropic-version", b"anthropic-beta"),
}
"""Client headers an engine needs to read a request of that API surface, forwarded on it only: the
Messages API's version and beta features (an engine that speaks Messages may key behaviour on them).
The client's `x-api-key` is a tenant key: never forwarded."""


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What the serve path knows about one request (see the module docstring)."""

    request_id: str
    started_s: float
    """The app clock's time at arrival (`Reply.started_s`)."""
    parsed: ParsedRequest
    pool: Pool
    tenant: Tenant
    priority: str
    routing: RoutingRequest
    upstream_body: bytes
    upstream_headers: Mapping[str, str]
    timers: RequestTimers
    idempotency_key: str | None
    authorization: str | None
    served_model: str = ""
    """The name the request is served under: the client's, or its alias's target (a pool's model, a
    declared name or a LoRA adapter); what routing, the prefix key and the per-name queue use."""
    upstream_model: str = ""
    """The model name the engine is sent (`gateway.upstream.model_catalog.ServedModel.upstream_name`)."""
    record: RequestRecord = NO_RECORD
    """The request's access-log facts and spans (`gateway.observability`); a no-op when both are off."""

    @property
    def model(self) -> str:
        """The client-facing model name (the pool's)."""
        return self.pool.model

    @property
    def stream(self) -> bool:
        """The client asked for a streamed (SSE) response."""
        return self.parsed.stream


def build_context(
    *,
    request_id: str,
    started_s: float,
    scope: Scope,
    parsed: ParsedRequest,
    served: ServedModel,
    tenant: Tenant,
    priority: str,
    engine_key: str | None = None,
    record: RequestRecord = NO_RECORD,
    cap_tier: CapTier = CapTier.PLAIN,
) -> RequestContext:
    """Fix the request's routing key, upstream bytes and timers (400 on a bad timer header); `record`
    (the request's observability record, started at arrival) is bound to the context. `served` is the
    pool and name the request's model resolved to (`gateway.upstream.model_catalog`)."""
    pool = served.pool
    slo_ttft_s, slo_tpot_s = request_slo(
        pool.settings.slo, header(scope, SLO_TTFT_HEADER.encode()), header(scope, SLO_TPOT_HEADER.encode())
    )
    routing = build_routing_request(
        served.name,
        parsed.prompt_text,
        pool.key_settings,
        session_key=session_key_of(header(scope, b"x-session-id"), parsed.user),
        estimated_prompt_tokens=parsed.estimated_prompt_tokens,
        max_tokens=parsed.max_tokens,
        slo_ttft_s=slo_ttft_s,
        slo_tpot_s=slo_tpot_s,
        lora_adapter=served.lora_adapter,
        cap_tier=cap_tier,
    )
    timers = request_timers(
        pool.settings.timeouts, header(scope, TTFT_HEADER.encode()), header(scope, IDLE_HEADER.encode())
    )
    ctx = RequestContext(
        request_id=request_id,
        started_s=started_s,
        parsed=parsed,
        pool=pool,
        tenant=tenant,
        priority=priority,
        routing=routing,
        upstream_body=rewrite_body(parsed, served.upstream_name),
        upstream_headers=forwarded_headers(scope["headers"], request_id, engine_key, parsed.endpoint.surface),
        timers=timers,
        idempotency_key=header(scope, b"idempotency-key"),
        authorization=header(scope, b"authorization"),
        served_model=served.name,
        upstream_model=served.upstream_name,
        record=record,
    )
    record.bind(ctx)
    return ctx


def forwarded_headers(
    raw_headers: list[tuple[bytes, bytes]],
    request_id: str,
    engine_key: str | None = None,
    surface: ApiSurface = ApiSurface.OPENAI,
) -> dict[str, str]:
    """Headers sent upstream: content-type JSON, the request id, `FORWARDED_HEADERS` (and the
    surface's `SURFACE_HEADERS`) from the client, and `Authorization: Bearer <engine_key>` when the pool
    has an engine key."""
    out = {"content-type": "application/json", "x-request-id": request_id}
    if engine_key is not None:
        out["authorization"] = f"Bearer {engine_key}"
    names = FORWARDED_HEADERS + SURFACE_HEADERS.get(surface, ())
    for key, value in raw_headers:
        if key in names:
            out[key.decode("latin-1")] = value.decode("latin-1")
    return out
