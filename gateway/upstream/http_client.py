"""Upstream HTTP clients: one per purpose, each shared by the whole process, with explicit limits.

- The *proxy* client (aiohttp) carries every proxied request: on this project's hot path it costs about
  a third of httpx's client-side CPU per request, streamed or not (docs/bench-log/2026-12-05-rounds.md,
  "Where the gateway's CPU goes (issue 7)"). TCP_NODELAY is set on its
  connections (Nagle off), so the first chunk is not held back waiting for a delayed ACK. No
  `Accept-Encoding` is sent, so engines answer uncompressed and bytes pass through as they come.
- The *control* client (httpx) serves background loops: health checks, engine /metrics scraping and
  discovery. They are off the hot path, and their code and tests stay simple.
Per-request timeouts are set by the proxy (connect from the pool; read = idle timeout for streams).
"""

from __future__ import annotations

import aiohttp
import httpx

from gateway.config.settings import UpstreamClientSettings

CONNECTION_HEADROOM = 16
"""Connections above `max_connections`: admission caps in-flight requests at `max_connections`
(`gateway.proxy.admit.PoolAdmission.claim`), so the pool itself never makes a request wait; the
headroom covers connections still closing."""


def build_proxy_session(settings: UpstreamClientSettings) -> aiohttp.ClientSession:
    """Must be called inside the running event loop (app start-up)."""
    connector = aiohttp.TCPConnector(
        limit=settings.max_connections + CONNECTION_HEADROOM,
        limit_per_host=0,
        keepalive_timeout=settings.keepalive_expiry_s,
        enable_cleanup_closed=True,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=("Accept-Encoding", "User-Agent"),
        raise_for_status=False,
        trust_env=False,
    )


def build_control_client(settings: UpstreamClientSettings) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=64, max_keepalive_connections=32, keepalive_expiry=settings.keepalive_expiry_s
    )
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(5.0, connect=2.0), trust_env=False)
