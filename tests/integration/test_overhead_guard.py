"""The performance guard (issue 30): the gateway's CPU time per request against a bare proxy's, side by
side in one run, as a ratio, so that the machine's speed cancels out.

A zero-delay mock engine, the gateway (default settings: prefix-index, tracing and access log off) and
the reference proxy (bench/reference_proxy.py: aiohttp server and client on uvloop, the body passed
through) run as processes on 127.0.0.1. The same closed-loop aiohttp client drives both servers in turn
(bench/cpu_per_request.py): one unmeasured warm-up block each, then `ROUNDS` rounds of one block per
server, the order rotating; each block's CPU time is the server process's utime + stime from
/proc/<pid>/stat read before and after it, so start-up and warm-up do not count, and a slow or busy
machine stretches the wall time but not the CPU per request. The ratio is total gateway CPU per request
÷ total reference CPU per request over the measured blocks, non-streamed and streamed
(`STREAM_TOKENS`-token streams) separately.

The regression guard: the test fails when the ratio exceeds `GUARD_NONSTREAM` (non-streamed) or
`GUARD_STREAM` (streamed). Each bound is 1.6 × the median ratio of seven runs of this test on the
2-core development host, busy and quiet, when the guard was set (main at 1ca8bd5: issue 30's leak fix
in, none of its hot-path work; the runs are in docs/bench-log/2026-12-05-serve-path-profile.md),
rounded to 0.1: the margin is for the noise of a busy 2-core CI host, so a change that makes the serve
path markedly dearer fails here. It is not the target: issue 30's goal is 1.0× (the gateway as cheap
as the bare proxy); lower the bounds as the serve path gets leaner. The whole test is bounded to 60 s
(a few times what it takes).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from bench.cpu_per_request import (
    chat_bodies,
    gateway_process,
    interleaved_blocks,
    ratio,
    reference_proxy,
    render,
    summarize,
)
from bench.fleet import Fleet
from bench.fleet_config import EngineOptions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

MODEL = "guard-model"
GUARD_NONSTREAM = 5.0
"""Gateway ÷ reference CPU per non-streamed request may not exceed this."""
GUARD_STREAM = 4.1
"""Gateway ÷ reference CPU per streamed request may not exceed this."""
ROUNDS = 3
CONCURRENCY = 64
NONSTREAM_REQUESTS = 1500
"""Per block: enough that /proc's 10 ms ticks are a few percent of the reference's blocks."""
STREAM_REQUESTS = 600
STREAM_TOKENS = 32
WARMUP = 300


def test_gateway_cpu_per_request_stays_within_its_guard_of_the_reference_proxy(tmp_path: Path) -> None:
    engine = EngineOptions(MODEL, first_token_delay_ms=0, token_delay_ms=0)
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(Fleet(1, engine, gateway=None, log_dir=tmp_path))
        upstream = fleet.engine_urls[0]
        gateway = stack.enter_context(gateway_process("gateway", MODEL, upstream, tmp_path))
        reference = stack.enter_context(reference_proxy(upstream, tmp_path))

        async def both() -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
            plain = await interleaved_blocks(
                [gateway, reference],
                chat_bodies(MODEL, max_tokens=8, stream=False),
                rounds=ROUNDS,
                requests=NONSTREAM_REQUESTS,
                concurrency=CONCURRENCY,
                warmup=WARMUP,
            )
            streamed = await interleaved_blocks(
                [gateway, reference],
                chat_bodies(MODEL, max_tokens=STREAM_TOKENS, stream=True),
                rounds=ROUNDS,
                requests=STREAM_REQUESTS,
                concurrency=CONCURRENCY,
                warmup=WARMUP // 3,
            )
            return summarize(plain), summarize(streamed)

        plain, streamed = asyncio.run(both())
    report = f"non-streamed:\n{render(plain)}\nstreamed:\n{render(streamed)}"
    print(report)
    assert plain["gateway"]["requests"] == ROUNDS * NONSTREAM_REQUESTS
    assert ratio(plain, "gateway", "reference") <= GUARD_NONSTREAM, report
    assert ratio(streamed, "gateway", "reference") <= GUARD_STREAM, report
