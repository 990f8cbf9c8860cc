"""`python -m cli serve` with `server.workers: 2` as a real process tree, for the tests of several workers
(tests/redis/test_workers.py with Redis state, tests/integration/test_workers_local_state.py with memory
state and the supervisor's local state server).

Which worker answered is read from the kernel, not from the gateway: the harness keeps the connection
open and finds the worker process holding the server end of it (/proc/<pid>/fd against /proc/net/tcp).
What each worker counted is read from its own file in the metrics directory (the supervisor makes it
under $TMPDIR, which the harness points at a short directory of its own). Linux only (/proc).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.mmap_dict import MmapedDict

from tests.servers import ServerThread, free_port

START_TIMEOUT_S = 30.0
STATE_SERVER = b"valkey-server"


@dataclass
class Supervised:
    process: subprocess.Popen[bytes]
    url: str
    port: int
    metrics_dir: Path
    log: Path
    tmpdir: Path
    """The supervisor's $TMPDIR (its metrics directory and the local state server's socket go there)."""

    def children(self) -> list[int]:
        """The supervisor's live child processes."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return [int(pid) for pid in children]

    def workers(self) -> list[int]:
        """The children that serve (not multiprocessing's resource tracker, not the state server)."""
        return [
            pid
            for pid in self.children()
            if b"resource_tracker" not in cmdline(pid) and STATE_SERVER not in cmdline(pid)
        ]

    def state_servers(self) -> list[int]:
        """The local state server among the children (none with Redis state)."""
        return [pid for pid in self.children() if STATE_SERVER in cmdline(pid)]

    def counted(self, metric: str, kind: str = "counter") -> dict[int, float]:
        """Per worker pid, the sum of `metric` over its labels, from the worker's own metrics file."""
        totals: dict[int, float] = {}
        for path in self.metrics_dir.glob(f"{kind}_*.db"):
            pid = int(path.stem.rsplit("_", 1)[1])
            for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):
                if json.loads(key)[1] == metric:
                    totals[pid] = totals.get(pid, 0.0) + value
        return totals


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def server_pid(gateway_port: int, client_port: int, pids: list[int]) -> int | None:
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


def request_from(
    supervised: Supervised, method: str, path: str, **kwargs: Any
) -> tuple[httpx.Response, int | None]:
    """`method path` on a fresh connection; the response and the worker that answered it."""
    with httpx.Client(base_url=supervised.url, timeout=20) as client:
        response = client.request(method, path, **kwargs)
        client_port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
        return response, server_pid(supervised.port, client_port, supervised.workers())


def start(
    tmp_path: Path,
    engines: list[ServerThread],
    model: str,
    state: dict[str, Any],
    drain_timeout_s: float = 10,
    **sections: Any,
) -> Supervised:
    """Two workers in front of `engines` (one static pool of `model`, unless `sections` has `pools`),
    `state:` as given, other top-level `sections` added; returned once each worker answered /readyz."""
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
            {"model": model, "replicas": {"static": [e.url for e in engines]}, "scrape": {"enabled": False}}
        ],
        "state": state,
        **sections,
    }
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps(config))
    log = tmp_path / "gateway.log"
    # short, so that the state server's socket fits under it (`gateway.ops.local_state.MAX_SOCKET_PATH`)
    metrics_base = Path(tempfile.mkdtemp(prefix="supervised-", dir="/tmp"))
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--config", str(path), "--log-level", "info"],
            env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(metrics_base)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    supervised = Supervised(process, f"http://127.0.0.1:{port}", port, Path(), log, metrics_base)
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
            response, pid = request_from(supervised, "GET", "/readyz")
        except httpx.HTTPError:
            time.sleep(0.05)
            continue
        if response.status_code == 200 and pid is not None:
            ready.add(pid)
    assert ready == set(supervised.workers())
    (supervised.metrics_dir,) = metrics_base.glob("llm-gateway-metrics-*")


def stop(supervised: Supervised) -> None:
    """After a test: the workers, the state server and the supervisor killed if still there; the
    supervisor's $TMPDIR removed."""
    if supervised.process.poll() is None:
        for pid in supervised.children():
            os.kill(pid, signal.SIGKILL)
        supervised.process.kill()
        supervised.process.wait()
    shutil.rmtree(supervised.tmpdir, ignore_errors=True)


def chat(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **fields}


def check_both_serve_and_either_shows_the_merged_metrics(started: Supervised, model: str) -> None:
    """`requests` chat requests, a connection each: both workers serve, and every scrape (from either)
    shows them all."""
    requests = 40
    workers = started.workers()
    assert len(workers) == 2 and all(b"multiprocessing" in cmdline(pid) for pid in workers)

    async def traffic() -> list[int]:
        limits = httpx.Limits(max_keepalive_connections=0)  # a connection per request
        async with httpx.AsyncClient(base_url=started.url, timeout=20, limits=limits) as client:
            responses = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=chat(model)) for _ in range(requests))
            )
        return [r.status_code for r in responses]

    assert asyncio.run(traffic()) == [200] * requests
    per_worker = started.counted("llm_gateway_requests_total")
    assert set(per_worker) == set(workers), per_worker
    assert all(count > 0 for count in per_worker.values()), f"both workers serve: {per_worker}"
    assert sum(per_worker.values()) == requests

    answered: Counter[int] = Counter()
    for _ in range(60):
        response, pid = request_from(started, "GET", "/metrics")
        assert pid in workers
        line = f'llm_gateway_requests_total{{model="{model}",outcome="success"}} {float(requests)}'
        assert line in response.text.splitlines(), "every scrape shows every worker's requests"
        answered[pid] += 1
        if len(answered) == 2:
            break
    assert set(answered) == set(workers), f"both workers answered a scrape: {answered}"


def check_sigterm_drains_both_workers(started: Supervised, model: str) -> None:
    """Streams in flight on both workers, SIGTERM: new requests get 503 `draining`, every stream
    finishes, each worker drains and exits, the supervisor exits 0 and removes the metrics directory."""
    workers = started.workers()
    streams = 12
    body = chat(model, max_tokens=100, stream=True)  # 100 tokens x 20 ms: about 2 s each

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
            refused = await client.post("/v1/chat/completions", json=chat(model))
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
