"""Where a request carries its tenant key: `Authorization: Bearer <key>`, or `x-api-key: <key>` (the
Anthropic clients' header) when no `Authorization` is sent. Every place that reads a tenant key — the
proxied endpoints and `GET /v1/models` — reads it here, so both headers are accepted everywhere."""

from __future__ import annotations

from gateway.api.asgi_io import Scope, header


def tenant_authorization(scope: Scope) -> str | None:
    """The request's `Authorization` value, or `Bearer <x-api-key>` when only `x-api-key` is sent;
    None without either (what `admission.tenants.TenantDirectory.resolve` reads)."""
    authorization = header(scope, b"authorization")
    if authorization is None:
        api_key = header(scope, b"x-api-key")
        authorization = None if api_key is None else f"Bearer {api_key}"
    return authorization
