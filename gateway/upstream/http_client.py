"""The one shared upstream HTTP client per process, with explicit connection limits.

Timeouts are set per request by the proxy (connect from the pool, read = idle timeout for streams);
the client-wide defaults below only apply to internal calls (health checks, scraping).
"""

from __future__ import annotations

import httpx

from gateway.settings import UpstreamClientSettings


def build_upstream_client(settings: UpstreamClientSettings) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=settings.max_connections,
        max_keepalive_connections=settings.max_keepalive_connections,
        keepalive_expiry=settings.keepalive_expiry_s,
    )
    return httpx.AsyncClient(
        limits=limits,
        timeout=httpx.Timeout(10.0, connect=2.0),
        follow_redirects=False,
        trust_env=False,
    )
