"""`python -m bench.reference_proxy --port P --upstream URL`: the bare proxy the gateway's cost is
measured against (`bench overhead`, tests/integration/test_overhead_guard.py).

An aiohttp server and an aiohttp client on uvloop, one upstream, nothing else: every request (any method,
any path) is sent to the same path on the upstream with its body and content type passed through; a
`text/event-stream` answer is relayed chunk by chunk as the upstream's bytes arrive, any other answer is
read whole and returned with its status and content type. No parsing, no routing, no retries, no
metrics, no logging per request. An upstream that cannot be reached is answered 502.

It is a yardstick, not a product: what a gateway must do beyond this is what its extra CPU per request
buys.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator

import aiohttp
import uvloop
from aiohttp import web

SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM: web.AppKey[str] = web.AppKey("upstream", str)


async def proxy(request: web.Request) -> web.StreamResponse:
    session, upstream = request.app[SESSION], request.app[UPSTREAM]
    headers = {"content-type": request.headers.get("content-type", "application/json")}
    body = await request.read()
    try:
        async with session.request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as answer:
            content_type = answer.headers.get("content-type", "application/json")
            if not content_type.startswith("text/event-stream"):
                return web.Response(
                    status=answer.status, body=await answer.read(), headers={"content-type": content_type}
                )
            relay = web.StreamResponse(status=answer.status, headers={"content-type": content_type})
            await relay.prepare(request)
            async for chunk in answer.content.iter_any():
                await relay.write(chunk)
            await relay.write_eof()
            return relay
    except aiohttp.ClientConnectionError as exc:
        return web.json_response({"error": {"message": f"upstream: {exc}"}}, status=502)


async def _session(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as s:
        app[SESSION] = s
        yield


def make_app(upstream: str) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")
    app.cleanup_ctx.append(_session)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reference_proxy", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:8001")
    args = parser.parse_args(argv)
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    web.run_app(make_app(args.upstream), host=args.host, port=args.port, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
