"""A lean closed-loop client for saturating one server (`bench overhead`'s closed-loop blocks): aiohttp,
one pooled session, the body encoded once per request shape, the answer read whole.

Why: at concurrency 64 on a small machine httpx's per-request cost (the `BenchClient`) caps the load
near a few hundred requests per second, so the servers under test idle between requests and their CPU
per request is not the saturated figure. This client costs a fraction of that.

It records what a saturated block needs and no more: status, `ok` (a 200, and for a stream its
`[DONE]`), the end-to-end latency; for a non-streamed answer TTFT = e2e, for a stream none (use
`BenchClient` or `RawSseClient` for TTFT and gaps). No retries, no Retry-After.
"""

from __future__ import annotations

import time

import aiohttp
import orjson

from bench.client import ClientOptions, sample_base
from bench.sample import Sample
from bench.workload import RequestSpec

DONE = b"data: [DONE]"


class LeanClient:
    """`Client` (bench/client.py) over one aiohttp session, opened on first use."""

    def __init__(self, options: ClientOptions) -> None:
        self.options = options
        self._session: aiohttp.ClientSession | None = None
        self._bodies: dict[RequestSpec, bytes] = {}

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _body(self, spec: RequestSpec) -> bytes:
        body = self._bodies.get(spec)
        if body is None:
            if len(self._bodies) >= 1024:
                self._bodies.clear()
            body = self._bodies[spec] = orjson.dumps(spec.body(self.options.model, self.options.stream))
        return body

    async def send(
        self, base_url: str, spec: RequestSpec, index: int, scheduled_s: float, run_start: float
    ) -> Sample:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.options.max_connections)
            timeout = aiohttp.ClientTimeout(total=self.options.timeout_s)
            headers = {"content-type": "application/json", **self.options.extra_headers}
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers)
        started = time.perf_counter()
        base = sample_base(spec, index, scheduled_s, started, run_start)
        path = "/v1/chat/completions" if spec.chat else "/v1/completions"
        try:
            async with self._session.post(
                base_url + path, data=self._body(spec), headers=spec.headers()
            ) as answer:
                body = await answer.read()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return Sample(
                **base, status=0, ok=False, e2e_s=time.perf_counter() - started, error=type(exc).__name__
            )
        e2e = time.perf_counter() - started
        ok = status == 200 and (not self.options.stream or DONE in body[-64:])
        return Sample(**base, status=status, ok=ok, e2e_s=e2e, ttft_s=None if self.options.stream else e2e)
