"""`server.workers: 2` with memory state, for real: `python -m cli serve` supervises two worker processes
and the local state server they share (`gateway.ops.local_state`), in front of mock engines; no Redis.
A tenant's limit and a replica's cap hold in total across both workers, the metrics are one view,
SIGTERM drains both, and the state server's death is a Redis outage until the supervisor restarts it.
The harness: tests/supervised.py. Linux only (/proc)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from admission.tenants import hash_api_key
from tests.servers import ServerThread
from tests.supervised import (
    Supervised,
    chat,
    check_both_serve_and_either_shows_the_merged_metrics,
    check_sigterm_drains_both_workers,
    request_from,
    start,
    stop,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc (Linux)"),
]

MODEL = "local-state-model"
KEY = "sk-limited-tenant"
RATE_PER_MIN = 6
CAP = 3
MEMORY = {"backend": "memory"}
Starter = Callable[..., Supervised]


@pytest.fixture
def engines(mock_engines) -> list[ServerThread]:
    return [mock_engines(model=MODEL, first_token_delay_ms=5, token_delay_ms=20) for _ in range(2)]


@pytest.fixture
def starter(tmp_path: Path) -> Iterator[Starter]:
    started: list[Supervised] = []

    def factory(engines: list[ServerThread], state: dict[str, Any] = MEMORY, **sections: Any) -> Supervised:
        supervised = start(tmp_path, engines, MODEL, state, **sections)
        started.append(supervised)
        return supervised

    yield factory
    for supervised in started:
        stop(supervised)


def _limited_tenant() -> list[dict[str, Any]]:
    return [{"name": "limited", "api_key_hashes": [hash_api_key(KEY)], "requests_per_min": RATE_PER_MIN}]


def _socket_path(started: Supervised) -> Path:
    """The local state server's socket, from the supervisor's start-up line."""
    return Path(started.log.read_text().split("at unix://")[1].split()[0])


def _accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_both_workers_serve_through_one_state_server_and_either_shows_the_merged_metrics(
    starter: Starter, engines: list[ServerThread]
) -> None:
    started = starter(engines)
    (state_server,) = started.state_servers()
    assert "local state server (valkey-server" in started.log.read_text()
    check_both_serve_and_either_shows_the_merged_metrics(started, MODEL)
    assert started.state_servers() == [state_server]


def test_sigterm_drains_both_workers_then_the_state_server_stops(
    starter: Starter, engines: list[ServerThread]
) -> None:
    started = starter(engines)
    (state_server,) = started.state_servers()
    socket_dir = _socket_path(started).parent
    assert socket_dir.exists()
    check_sigterm_drains_both_workers(started, MODEL)
    assert not Path(f"/proc/{state_server}").exists(), "stopped after the workers (and reaped)"
    assert not socket_dir.exists(), "its directory is removed"


def test_a_tenant_limit_of_r_per_minute_admits_r_in_total_across_both_workers(
    starter: Starter, engines: list[ServerThread]
) -> None:
    started = starter(engines, tenants=_limited_tenant())
    headers = {"Authorization": f"Bearer {KEY}"}
    began = time.monotonic()
    answers = [
        request_from(started, "POST", "/v1/chat/completions", json=chat(MODEL), headers=headers)
        for _ in range(40)
    ]
    elapsed_s = time.monotonic() - began
    per_worker = Counter(pid for _, pid in answers)
    assert set(per_worker) == set(started.workers()), per_worker
    assert all(n > RATE_PER_MIN for n in per_worker.values()), (
        f"each worker alone could admit r: {per_worker}"
    )
    statuses = Counter(response.status_code for response, _ in answers)
    refills = int(elapsed_s * RATE_PER_MIN / 60)
    assert set(statuses) == {200, 429}, statuses
    assert RATE_PER_MIN <= statuses[200] <= RATE_PER_MIN + refills, (statuses, elapsed_s)
    refused = [response for response, _ in answers if response.status_code == 429]
    assert all(r.headers["x-gateway-reject-reason"] == "rate_limited" for r in refused)


def test_no_replica_exceeds_its_cap_across_both_workers(starter: Starter, mock_engines) -> None:
    engine = mock_engines(model=MODEL, first_token_delay_ms=5, token_delay_ms=10)
    pool = {
        "model": MODEL,
        "replicas": {"static": [engine.url]},
        "max_concurrency_per_replica": CAP,
        "scrape": {"enabled": False},
    }
    admission = {"classes": {"interactive": {"max_wait_s": 30}}, "default_priority": "interactive"}
    started = starter([engine], pools=[pool], admission=admission)
    requests = 24
    body = chat(MODEL, max_tokens=20)  # 20 tokens x 10 ms: about 0.2 s each

    async def burst() -> list[int]:
        limits = httpx.Limits(max_keepalive_connections=0)  # a connection each: both workers get some
        async with httpx.AsyncClient(base_url=started.url, timeout=60, limits=limits) as client:
            responses = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=body) for _ in range(requests))
            )
        return [r.status_code for r in responses]

    assert asyncio.run(burst()) == [200] * requests
    per_worker = started.counted("llm_gateway_requests_total")
    assert len(per_worker) == 2 and all(n > CAP for n in per_worker.values()), per_worker
    assert engine.app.counters.max_active == CAP, "the cap is reached, never passed, by both together"


def test_the_state_servers_death_is_an_outage_until_the_supervisor_restarts_it(
    starter: Starter, engines: list[ServerThread]
) -> None:
    """fail_closed: while the state server is gone, a limited tenant's requests are refused with 503
    `state_unavailable` and counted; the supervisor (held stopped until then, so that the outage is
    seen) starts a new one, and the workers use it without a restart of their own."""
    started = starter(
        engines, state={"backend": "memory", "on_error": "fail_closed"}, tenants=_limited_tenant()
    )
    headers = {"Authorization": f"Bearer {KEY}"}
    post: dict[str, Any] = {"json": chat(MODEL), "headers": headers}
    assert request_from(started, "POST", "/v1/chat/completions", **post)[0].status_code == 200
    (first,) = started.state_servers()
    workers = started.workers()
    socket_path = _socket_path(started)

    os.kill(started.process.pid, signal.SIGSTOP)
    try:
        os.kill(first, signal.SIGKILL)
        _wait_until(lambda: not _accepts(socket_path), "its socket refuses connections")
        answered: set[int | None] = set()
        for _ in range(30):
            response, pid = request_from(started, "POST", "/v1/chat/completions", **post)
            assert response.status_code == 503, response.text
            assert response.headers["x-gateway-reject-reason"] == "state_unavailable"
            answered.add(pid)
            if answered >= set(workers):
                break
        assert answered >= set(workers), "both workers see the outage"
    finally:
        os.kill(started.process.pid, signal.SIGCONT)

    _wait_until(lambda: len(started.state_servers()) == 1 and started.state_servers() != [first], "restart")

    def served() -> bool:
        return request_from(started, "POST", "/v1/chat/completions", **post)[0].status_code == 200

    _wait_until(served, "the workers use the restarted state server")
    errors = started.counted("llm_gateway_state_errors_total")
    assert set(errors) == set(workers) and all(n > 0 for n in errors.values()), errors
    assert f"local state server {first} exited unasked" in started.log.read_text()


def test_a_killed_supervisor_leaves_no_state_server_behind(
    starter: Starter, engines: list[ServerThread]
) -> None:
    """SIGKILL to the supervisor: its workers drain (their pipe closed) and the state server gets
    SIGTERM from the kernel (PR_SET_PDEATHSIG); none serves on unsupervised."""
    started = starter(engines)
    (state_server,) = started.state_servers()
    workers = started.workers()
    started.process.kill()
    started.process.wait()

    def gone(pid: int) -> bool:
        try:
            return b"Z" in Path(f"/proc/{pid}/stat").read_bytes().split(b")")[1][:3]
        except OSError:
            return True

    _wait_until(lambda: all(gone(pid) for pid in [state_server, *workers]), "all gone", timeout_s=20)
