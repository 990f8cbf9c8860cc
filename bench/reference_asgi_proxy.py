"""`python -m bench.reference_asgi_proxy --port P --upstream URL`: the floor of the gateway's own stack,
measured beside the gateway and the aiohttp reference proxy (`bench overhead`).

The same bare proxy as bench/reference_proxy.py, built on what the gateway is built on: uvicorn with
httptools and uvloop serving a plain ASGI callable, and one aiohttp client session upstream. Every
request (any method, any path) is sent to the same path on the upstream with its body and content type
passed through; a `text/event-stream` answer is relayed chunk by chunk (one ASGI body message per
chunk the upstream's bytes arrive in), any other answer is read whole and returned with its status,
content type and length. No parsing, no routing, no retries, no metrics, no logging per request, the
interpreter's garbage-collector settings. An upstream that cannot be reached is answered 502.

What the gateway costs beyond this is its own logic; what this costs beyond the aiohttp reference is
the stack (uvicorn's protocol and the ASGI message passing against aiohttp's server).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import uvicorn

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
SESSION: list[aiohttp.ClientSession] = []
UPSTREAM: list[str] = []


async def _lifespan(receive: Receive, send: Send) -> None:
    while (await receive())["type"] != "lifespan.shutdown":
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        SESSION.append(aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)))
        await send({"type": "lifespan.startup.complete"})
    await SESSION[0].close()
    await send({"type": "lifespan.shutdown.complete"})


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        return await _lifespan(receive, send)
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    ctype = next((v for k, v in scope["headers"] if k == b"content-type"), b"application/json")
    query = scope["query_string"]
    url = UPSTREAM[0] + scope["path"] + ("?" + query.decode() if query else "")
    try:
        async with SESSION[0].request(
            scope["method"], url, data=body, headers={"content-type": ctype.decode()}
        ) as answer:
            out = answer.headers.get("content-type", "application/json").encode()
            if not out.startswith(b"text/event-stream"):
                data = await answer.read()
                headers = [(b"content-type", out), (b"content-length", str(len(data)).encode())]
                await send({"type": "http.response.start", "status": answer.status, "headers": headers})
                return await send({"type": "http.response.body", "body": data})
            headers = [(b"content-type", out)]
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            async for chunk in answer.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
    except aiohttp.ClientConnectionError as exc:
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 502, "headers": headers})
        error = b'{"error": {"message": "upstream: %s"}}' % type(exc).__name__.encode()
        await send({"type": "http.response.body", "body": error})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reference_asgi_proxy", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:8001")
    args = parser.parse_args(argv)
    UPSTREAM.append(args.upstream.rstrip("/"))
    uvicorn.run(
        app, host=args.host, port=args.port, loop="uvloop", http="httptools", ws="none", lifespan="on",
        access_log=False, log_level="warning",
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
