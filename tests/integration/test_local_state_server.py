"""The local state server of several workers on memory state (`gateway.ops.local_state`), for real: a
`valkey-server` process on a private Unix socket that the Redis stores use as they use Redis."""

from __future__ import annotations

import os
import signal
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from admission.rate_limit import TenantRateLimits, TokenBucketLimit
from admission.redis_rate_limit import RedisRateLimitStore
from core.clock import FakeClock
from core.shared_state import RedisBackend
from core.state_outage import FailureMode
from gateway.config.settings import parse_settings
from gateway.ops import local_state
from gateway.ops.local_state import LocalStateServer, server_binary, sharing_settings, uses_local_state

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc (Linux)")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


@pytest.fixture
def server(clock: FakeClock) -> Iterator[LocalStateServer]:
    started = LocalStateServer(server_binary(), clock)
    started.start()
    yield started
    started.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"


def test_a_missing_binary_is_a_file_not_found(tmp_path: Path) -> None:
    server = LocalStateServer(tmp_path / "no-such-server")
    with pytest.raises(FileNotFoundError):
        server.start()
    assert not server.socket_path.parent.exists(), "its directory is removed"


def test_a_server_that_exits_at_start_is_a_timeout_naming_it(tmp_path: Path) -> None:
    binary = tmp_path / "exits"
    binary.write_text("#!/bin/sh\necho 'no luck here' >&2\nexit 7\n")
    binary.chmod(0o700)
    server = LocalStateServer(binary)
    with pytest.raises(TimeoutError, match="exited at start"):
        server.start()
    assert not server.socket_path.parent.exists(), "its directory is removed"


def test_only_several_workers_on_memory_state_use_it() -> None:
    assert uses_local_state(2, "memory")
    assert not uses_local_state(1, "memory")
    assert not uses_local_state(2, "redis")


def test_the_workers_settings_point_at_it_and_keep_the_rest() -> None:
    settings = parse_settings(
        {"server": {"workers": 2}, "state": {"on_error": "fail_closed", "timeout_s": 1.5}}
    )
    shared = sharing_settings(settings, "unix:///tmp/x/state.sock")
    assert shared.state.backend == "redis" and shared.state.url == "unix:///tmp/x/state.sock"
    assert shared.state.on_error == "fail_closed" and shared.state.timeout_s == 1.5
    assert shared.server == settings.server and settings.state.backend == "memory"


def test_its_socket_is_private_and_nothing_else_listens(server: LocalStateServer) -> None:
    directory = server.socket_path.parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_ISSOCK(server.socket_path.stat().st_mode)
    assert server.url == f"unix://{server.socket_path}"
    pid = server.pid
    assert pid is not None
    inodes = {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
    tcp = Path("/proc/net/tcp").read_text() + Path("/proc/net/tcp6").read_text()
    listening = [line.split()[9] for line in tcp.splitlines()[1:] if line.split()[3] == "0A"]
    assert not [inode for inode in listening if f"socket:[{inode}]" in inodes], "no TCP listener"


async def test_two_backends_share_one_atomic_limit_through_it(server: LocalStateServer) -> None:
    """The stores' Lua scripts run unchanged (server TIME, EVALSHA then SCRIPT LOAD): a bucket of 5
    shared by two 'workers' admits 5 in total."""
    backends = [RedisBackend.from_url(server.url, timeout_s=2.0) for _ in range(2)]
    limits = TenantRateLimits(requests=TokenBucketLimit(capacity=5, refill_per_s=0.001))
    try:
        results = [await RedisRateLimitStore(backends[i % 2]).acquire("t", limits, 1) for i in range(12)]
    finally:
        for backend in backends:
            await backend.aclose()
    assert [r.allowed for r in results] == [True] * 5 + [False] * 7
    assert not any(r.degraded for r in results)


async def test_its_death_is_an_outage_answered_by_the_failure_mode_then_a_restart_heals(
    server: LocalStateServer, clock: FakeClock
) -> None:
    backend = RedisBackend.from_url(server.url, on_error=FailureMode.FAIL_CLOSED, timeout_s=0.5)
    store = RedisRateLimitStore(backend)
    limits = TenantRateLimits(requests=TokenBucketLimit(capacity=1, refill_per_s=0.001))
    try:
        assert (await store.acquire("t", limits, 1)).allowed
        first = server.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        while server.pid is not None:  # reaped: every thread of it gone (its leader is a zombie before)
            time.sleep(0.01)
        refused = await store.acquire("t", limits, 1)
        assert refused.degraded and not refused.allowed, "fail_closed while it is gone"
        assert backend.errors_total >= 1 and not backend.available

        clock.set(clock.now_s() + local_state.RESTART_INTERVAL_S - 0.01)
        server.keep_running()
        assert server.pid is None, "no restart sooner than RESTART_INTERVAL_S after its last start"
        clock.advance(0.02)
        server.keep_running()
        second = server.pid
        assert second is not None and second != first
        deadline = time.monotonic() + 5
        while (result := await store.acquire("t", limits, 1)).degraded:
            assert time.monotonic() < deadline, "the restarted server answers"
            time.sleep(0.02)
        assert result.allowed, "restarted empty: the bucket starts full again"
        assert not (await store.acquire("t", limits, 1)).allowed
    finally:
        await backend.aclose()


def test_stop_ends_it_and_removes_its_directory(clock: FakeClock) -> None:
    server = LocalStateServer(server_binary(), clock)
    server.start()
    pid, directory = server.pid, server.socket_path.parent
    assert pid is not None and directory.exists()
    server.stop()
    assert not directory.exists() and server.pid is None
    deadline = time.monotonic() + 5
    while _alive(pid):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    server.stop()  # idempotent


def test_a_long_tmpdir_falls_back_to_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr("tempfile.tempdir", None)
    server = LocalStateServer(server_binary())
    server.start()
    try:
        assert str(server.socket_path).startswith("/tmp/llm-gateway-state-")
        assert len(str(server.socket_path)) <= local_state.MAX_SOCKET_PATH
    finally:
        server.stop()


def test_serve_exits_3_naming_it_when_it_cannot_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Several workers on memory state and no server to run: no worker starts, the address is freed."""
    from gateway import uvicorn_runner
    from tests.servers import free_port

    monkeypatch.setattr(uvicorn_runner, "server_binary", lambda: tmp_path / "no-such-server")
    port = free_port()
    settings = parse_settings({"server": {"host": "127.0.0.1", "port": port, "workers": 2}})
    assert uvicorn_runner.serve(settings, "warning") == uvicorn_runner.STARTUP_FAILURE
    assert "cannot start the local state server" in capfd.readouterr().err
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))
