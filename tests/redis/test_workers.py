"""`server.workers: 2` for real: `python -m cli serve` supervises two worker processes on one address,
sharing Redis state, in front of two mock engines.

Which worker answered is read from the kernel, not from the gateway: the test keeps the connection
open and finds the worker process holding the server end of it (/proc/<pid>/fd against /proc/net/tcp).
What each worker counted is read from its own file in the metrics directory (the supervisor makes it
under $TMPDIR, which the test points at its own directory). Linux only (/proc).
"""

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
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict

from tests.servers import ServerThread, free_port

from .conftest import REDIS_URL

pytestmark = [
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc (Linux)"),
]

MODEL = "workers-model"
REQUESTS = 40
START_TIMEOUT_S = 30.0
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@dataclass
class Supervised:
    process: subprocess.Popen[bytes]
    url: str
    port: int
    metrics_dir: Path
    log: Path

    def workers(self) -> list[int]:
        """The supervisor's live child processes that serve (not multiprocessing's resource tracker)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return [int(pid) for pid in children if b"resource_tracker" not in _cmdline(int(pid))]

    def counted(self, metric: str, kind: str = "counter") -> dict[int, float]:
        """Per worker pid, the sum of `metric` over its labels, from the worker's own metrics file."""
        totals: dict[int, float] = {}
        for path in self.metrics_dir.glob(f"{kind}_*.db"):
            pid = int(path.stem.rsplit("_", 1)[1])
            for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):
                if json.loads(key)[1] == metric:
                    totals[pid] = totals.get(pid, 0.0) + value
        return totals


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _server_pid(gateway_port: int, client_port: int, pids: list[int]) -> int | None:
    """The process among `pids` holding the server end of the connection 127.0.0.1:client_port ->
    127.0.0.1:gateway_port."""
    local, remote = f"0100007F:{gateway_port:04X}", f"0100007F:{client_port:04X}"
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote:
            inode = fields[9]
    if inode is None:
        return None
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        if f"socket:[{inode}]" in links:
            return pid
    return None


def _get_from(supervised: Supervised, path: str) -> tuple[httpx.Response, int | None]:
    """GET `path` on a fresh connection; the response and the worker that answered it."""
    with httpx.Client(base_url=supervised.url, timeout=5) as client:
        response = client.get(path)
        client_port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
        return response, _server_pid(supervised.port, client_port, supervised.workers())


def _start(tmp_path: Path, engines: list[ServerThread], drain_timeout_s: float = 10) -> Supervised:
    port = free_port()
    config = {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "workers": 2,
            "drain_timeout_s": drain_timeout_s,
            "readiness_propagation_s": 1,
        },
        "pools": [
            {"model": MODEL, "replicas": {"static": [e.url for e in engines]}, "scrape": {"enabled": False}}
        ],
        "state": {
            "backend": "redis",
            "url": REDIS_URL,
            "key_prefix": f"llm-gateway-test:{uuid.uuid4().hex}:",
            "timeout_s": 2.0,
        },
    }
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps(config))
    log = tmp_path / "gateway.log"
    metrics_base = tmp_path / "tmp"
    metrics_base.mkdir()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--config", str(path), "--log-level", "info"],
            env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(metrics_base)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    supervised = Supervised(process, f"http://127.0.0.1:{port}", port, Path(), log)
    _wait_both_ready(supervised, metrics_base)
    return supervised


def _wait_both_ready(supervised: Supervised, metrics_base: Path) -> None:
    """Until each worker has answered /readyz 200 (each on a connection of its own)."""
    ready: set[int] = set()
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(ready) < 2:
        assert supervised.process.poll() is None, f"serve exited:\n{supervised.log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, (
            f"workers not ready: {ready}\n{supervised.log.read_text()[-3000:]}"
        )
        try:
            response, pid = _get_from(supervised, "/readyz")
        except httpx.HTTPError:
            time.sleep(0.05)
            continue
        if response.status_code == 200 and pid is not None:
            ready.add(pid)
    assert ready == set(supervised.workers())
    (supervised.metrics_dir,) = metrics_base.glob("llm-gateway-metrics-*")


def _stop(supervised: Supervised) -> None:
    """After a failed test: the workers and the supervisor killed."""
    if supervised.process.poll() is not None:
        return
    for pid in supervised.workers():
        os.kill(pid, signal.SIGKILL)
    supervised.process.kill()
    supervised.process.wait()


@pytest.fixture
def started(tmp_path: Path, mock_engines, redis_reachable: str | None) -> Iterator[Supervised | None]:
    if redis_reachable is not None:  # the autouse fixture skips (or fails) the test
        yield None
        return
    engines = [mock_engines(model=MODEL, first_token_delay_ms=5, token_delay_ms=20) for _ in range(2)]
    supervised = _start(tmp_path, engines)
    yield supervised
    _stop(supervised)


def test_both_workers_serve_and_either_shows_the_merged_metrics(started: Supervised) -> None:
    workers = started.workers()
    assert len(workers) == 2 and all(b"multiprocessing" in _cmdline(pid) for pid in workers)

    async def traffic() -> list[int]:
        limits = httpx.Limits(max_keepalive_connections=0)  # a connection per request
        async with httpx.AsyncClient(base_url=started.url, timeout=20, limits=limits) as client:
            responses = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=CHAT) for _ in range(REQUESTS))
            )
        return [r.status_code for r in responses]

    assert asyncio.run(traffic()) == [200] * REQUESTS
    per_worker = started.counted("llm_gateway_requests_total")
    assert set(per_worker) == set(workers), per_worker
    assert all(count > 0 for count in per_worker.values()), f"both workers serve: {per_worker}"
    assert sum(per_worker.values()) == REQUESTS

    answered: Counter[int] = Counter()
    for _ in range(60):
        response, pid = _get_from(started, "/metrics")
        assert pid in workers
        line = f'llm_gateway_requests_total{{model="{MODEL}",outcome="success"}} {float(REQUESTS)}'
        assert line in response.text.splitlines(), "every scrape shows every worker's requests"
        answered[pid] += 1
        if len(answered) == 2:
            break
    assert set(answered) == set(workers), f"both workers answered a scrape: {answered}"


def test_sigterm_drains_both_workers_and_the_supervisor_exits_0(started: Supervised) -> None:
    workers = started.workers()
    streams = 12
    body = {**CHAT, "max_tokens": 100, "stream": True}  # 100 tokens x 20 ms: about 2 s each

    async def scenario() -> tuple[list[str], httpx.Response]:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=started.url, timeout=30, limits=limits) as client:

            async def stream() -> str:
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    assert response.status_code == 200
                    return "".join([line async for line in response.aiter_lines()])

            tasks = [asyncio.create_task(stream()) for _ in range(streams)]
            deadline = time.monotonic() + 10
            while True:  # until both workers have streams in flight
                inflight = started.counted("llm_gateway_inflight", "gauge_livesum")
                if len(inflight) == 2 and all(v > 0 for v in inflight.values()):
                    break
                assert time.monotonic() < deadline, f"streams in flight per worker: {inflight}"
                await asyncio.sleep(0.02)
            started.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            refused = await client.post("/v1/chat/completions", json=CHAT)
            return await asyncio.gather(*tasks), refused

    bodies, refused = asyncio.run(scenario())
    assert refused.status_code == 503 and refused.headers["x-gateway-reject-reason"] == "draining"
    assert all(text.endswith("data: [DONE]") for text in bodies), "every in-flight stream finishes"
    try:
        code = started.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        code = None
    assert code == 0, started.log.read_text()[-4000:]
    log = started.log.read_text()
    assert all(f"worker {pid} drained and exited" in log for pid in workers), log[-3000:]
    assert not started.metrics_dir.exists(), "the supervisor removes the metrics directory"
