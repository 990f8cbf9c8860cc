"""Three real gateway processes (`python -m cli serve`) sharing one Redis, in front of two mock
engines: a tenant's requests/min limit holds in total, and no engine ever sees more than the
per-replica cap of concurrent requests — also after one gateway is killed with SIGKILL mid-load (its
slot leases expire within `replica_lease_ttl_s` and the survivors take its share over)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from admission.tenants import hash_api_key
from tests.servers import ServerThread, free_port, start_mock_engine

from .conftest import REDIS_URL

pytestmark = pytest.mark.redis

MODEL = "multi-model"
CAP = 4
ENGINES = 2
LEASE_TTL_S = 2.0
LINGER_S = 0.5
RATE_PER_MIN = 60
LIMITED_KEY, LOAD_KEY = "sk-limited-tenant", "sk-load-tenant"
READY_TIMEOUT_S = 30.0
GATEWAY_COMMAND = (sys.executable, "-m", "cli", "serve")


@dataclass
class Fleet:
    engines: list[ServerThread]
    urls: list[str]
    processes: list[subprocess.Popen[bytes]]
    key_prefix: str
    logs: list[Path] = field(default_factory=list)


def gateway_config(port: int, engines: list[ServerThread], key_prefix: str) -> dict[str, object]:
    return {
        "server": {"host": "127.0.0.1", "port": port, "drain_timeout_s": 2},
        "pools": [
            {
                "model": MODEL,
                "replicas": {"static": [engine.url for engine in engines]},
                "policy": "least-load",
                "max_concurrency_per_replica": CAP,
                "scrape": {"enabled": False},
                "health": {"enabled": False},
            }
        ],
        "state": {
            "backend": "redis",
            "url": REDIS_URL,
            "on_error": "fail_closed",
            # A ceiling, not a delay: Redis answers here in a millisecond, but the first burst of 120
            # requests opens connections on a loaded CI host, which took longer than the default 0.25 s.
            "timeout_s": 2.0,
            "key_prefix": key_prefix,
            "replica_lease_ttl_s": LEASE_TTL_S,
            "replica_credit_linger_s": LINGER_S,
        },
        "admission": {"classes": {"interactive": {"max_wait_s": 30}}, "default_priority": "interactive"},
        "tenants": [
            {
                "name": "limited",
                "api_key_hashes": [hash_api_key(LIMITED_KEY)],
                "requests_per_min": RATE_PER_MIN,
            },
            {"name": "load", "api_key_hashes": [hash_api_key(LOAD_KEY)]},
        ],
    }


def wait_ready(fleet: Fleet) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    pending = set(fleet.urls)
    while pending and time.monotonic() < deadline:
        for url in list(pending):
            try:
                if httpx.get(url + "/readyz", timeout=0.5).status_code == 200:
                    pending.discard(url)
            except httpx.HTTPError:
                pass
        for process, log in zip(fleet.processes, fleet.logs, strict=True):
            assert process.poll() is None, f"gateway exited early:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)
    assert not pending, f"gateways not ready: {pending}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_reachable: str | None) -> Iterator[Fleet]:
    if redis_reachable is not None:  # the autouse fixture skips (or fails) each test
        yield Fleet([], [], [], "")
        return
    tmp = tmp_path_factory.mktemp("multi")
    key_prefix = f"llm-gateway-test:{uuid.uuid4().hex}:"
    engines = [
        start_mock_engine(model=MODEL, first_token_delay_ms=20, token_delay_ms=10) for _ in range(ENGINES)
    ]
    fleet = Fleet(engines, [], [], key_prefix)
    try:
        for n in range(3):
            port = free_port()
            config = tmp / f"gateway-{n}.json"
            config.write_text(json.dumps(gateway_config(port, engines, key_prefix)))
            log = tmp / f"gateway-{n}.log"
            fleet.logs.append(log)
            with log.open("wb") as sink:
                fleet.processes.append(
                    subprocess.Popen(
                        [*GATEWAY_COMMAND, "--config", str(config), "--log-level", "warning"],
                        env={**os.environ, "PYTHONUNBUFFERED": "1"},
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                    )
                )
            fleet.urls.append(f"http://127.0.0.1:{port}")
        wait_ready(fleet)
        yield fleet
    finally:
        for process in fleet.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in fleet.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for engine in engines:
            engine.stop()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{key_prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()


def body(max_tokens: int) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens}


def test_a_tenant_limit_of_r_per_minute_admits_r_in_total_across_three_gateways(fleet: Fleet) -> None:
    """The bucket holds R (the minute's quota, the burst) and refills R/60 per second: 2R requests sent
    at once over the three gateways admit R plus what refilled while they arrived."""

    async def send_all() -> tuple[Counter[str], float]:
        clients = [httpx.AsyncClient(base_url=url, timeout=30) for url in fleet.urls]
        headers = {"authorization": f"Bearer {LIMITED_KEY}"}

        async def one(n: int) -> str:
            response = await clients[n % 3].post("/v1/chat/completions", json=body(1), headers=headers)
            if response.status_code == 429:
                assert int(response.headers["retry-after"]) >= 1
                return str(response.headers.get("x-gateway-reject-reason"))
            return str(response.status_code)

        started = time.monotonic()
        outcomes = await asyncio.gather(*(one(n) for n in range(2 * RATE_PER_MIN)))
        elapsed_s = time.monotonic() - started
        for client in clients:
            await client.aclose()
        return Counter(outcomes), elapsed_s

    outcomes, elapsed_s = asyncio.run(send_all())
    admitted = outcomes["200"]
    print(f"\nrate limit: R={RATE_PER_MIN}/min, 2R sent in {elapsed_s:.2f} s: {dict(outcomes)}")
    assert set(outcomes) <= {"200", "rate_limited"}, outcomes
    assert abs(admitted - RATE_PER_MIN) <= 0.05 * RATE_PER_MIN, outcomes
    assert admitted <= RATE_PER_MIN + elapsed_s * RATE_PER_MIN / 60 + 1, (outcomes, elapsed_s)


@dataclass
class LoadResult:
    done_at: list[list[float]] = field(default_factory=lambda: [[], [], []])
    outcomes: list[Counter[str]] = field(default_factory=lambda: [Counter(), Counter(), Counter()])


async def run_load(fleet: Fleet, clients_per_gateway: int, stop: asyncio.Event, result: LoadResult) -> None:
    """Closed-loop clients on every gateway until `stop`; a killed gateway's clients stop by themselves."""

    async def worker(n: int, client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            try:
                response = await client.post("/v1/chat/completions", json=body(20), headers=headers)
            except httpx.TransportError:
                result.outcomes[n]["connection_error"] += 1
                return
            outcome = str(response.status_code)
            if response.status_code != 200:
                outcome += f":{response.headers.get('x-gateway-reject-reason')}"
            result.outcomes[n][outcome] += 1
            result.done_at[n].append(time.monotonic())

    headers = {"authorization": f"Bearer {LOAD_KEY}"}
    clients = [httpx.AsyncClient(base_url=url, timeout=40) for url in fleet.urls]
    try:
        await asyncio.gather(*(worker(n, clients[n]) for n in range(3) for _ in range(clients_per_gateway)))
    finally:
        for client in clients:
            await client.aclose()


async def sample_active(fleet: Fleet, stop: asyncio.Event, peaks: list[int]) -> None:
    while not stop.is_set():
        peaks.append(sum(engine.app.counters.active for engine in fleet.engines))
        await asyncio.sleep(0.01)


def unexpired_leases(fleet: Fleet) -> int:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    seconds, micros = client.time()
    now_s = seconds + micros / 1e6
    total = 0
    for engine in fleet.engines:
        total += int(
            client.zcount(
                f"{fleet.key_prefix}lease:replica:{MODEL}@127.0.0.1:{engine.port}", f"({now_s}", "+inf"
            )
        )
    client.close()
    return total


def test_no_replica_exceeds_its_cap_across_gateways_even_after_one_is_killed(fleet: Fleet) -> None:
    clients_per_gateway = 8  # 24 concurrent requests for 2 x 4 slots
    before_kill_s, takeover_s, after_s = 3.0, LEASE_TTL_S + 1.0, 3.0

    async def scenario() -> tuple[LoadResult, float, list[int]]:
        stop, result, peaks = asyncio.Event(), LoadResult(), []
        load = asyncio.create_task(run_load(fleet, clients_per_gateway, stop, result))
        await asyncio.sleep(before_kill_s)
        fleet.processes[2].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        await asyncio.sleep(takeover_s)
        sampling = asyncio.Event()
        sampler = asyncio.create_task(sample_active(fleet, sampling, peaks))
        await asyncio.sleep(after_s)
        sampling.set()
        stop.set()
        await asyncio.wait_for(load, timeout=30)
        await sampler
        return result, killed_at, peaks

    result, killed_at, peaks = asyncio.run(scenario())
    fleet.processes[2].wait(timeout=5)
    max_active = [engine.app.counters.max_active for engine in fleet.engines]
    taken_over_at = killed_at + takeover_s
    served = [
        (sum(t < killed_at for t in times), sum(t >= taken_over_at for t in times))
        for times in result.done_at
    ]
    print(
        f"\nmax_active per engine {max_active} (cap {CAP}); served (before kill, after takeover) per "
        f"gateway {served}; peak total active after takeover {max(peaks)} of {CAP * ENGINES}; "
        f"outcomes {[dict(c) for c in result.outcomes]}"
    )
    assert all(active <= CAP for active in max_active), max_active
    assert all(before > 0 for before, _ in served), served  # all three served before the kill
    for n in (0, 1):  # the survivors served everything they were sent, after the takeover too
        assert set(result.outcomes[n]) == {"200"}, result.outcomes[n]
        assert served[n][1] > 0, served
    assert max(peaks) == CAP * ENGINES, "the killed gateway's slots came back to the survivors"
    deadline = time.monotonic() + 4 * LINGER_S + 2.0
    while unexpired_leases(fleet) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert unexpired_leases(fleet) == 0, "idle credits go back to Redis; the dead gateway's expired"
    assert all(engine.app.counters.active == 0 for engine in fleet.engines)
