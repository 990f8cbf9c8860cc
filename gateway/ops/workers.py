"""Several gateway processes on one address (`server.workers` > 1): the supervisor.

- **The socket**: the supervisor binds the address once (port 0 resolved to one port, the address
  reserved: `bind_listener`) and hands the socket to every worker. On Linux each worker then binds a
  socket of its own to that address with SO_REUSEPORT and listens on it (`worker_listener`): the kernel
  spreads new connections over the workers by a hash of their addresses, independent of timing. One
  shared accept queue does not: the worker that wakes first accepts every connection pending at that
  moment (uvloop accepts until the queue is empty), so a burst of connections (a client opening its
  pool) can land mostly on one worker. The cost: connections still queued on a worker's own socket
  when it dies unasked are reset, and another process of the same user could bind the port too.
  Elsewhere (SO_REUSEPORT does not balance) the workers share the supervisor's socket.
- **Workers are fresh interpreters** (multiprocessing's `spawn`, the socket's descriptor passed to
  each), not forks: nothing of the supervisor is shared by accident (no event loop, no connection, no
  metric value). Each builds its own `GatewayApp` and is one gateway instance of the fleet, sharing
  caps (slot credits), rate limits, the prefix index, quarantine and response state through Redis
  exactly as separate instances do: the configured Redis with `state.backend: redis`; with memory state
  the supervisor's own local state server (`gateway.ops.local_state`), started before the first
  worker, kept running (restarted when it dies: the workers meanwhile see a Redis outage) and stopped
  after the last worker has exited. Each worker health-checks and scrapes every replica.
- **Metrics are one view**: before the first worker starts, `PROMETHEUS_MULTIPROC_DIR` is set to a
  fresh temporary directory (under `$TMPDIR`, logged at start), and `/metrics` of any worker renders
  every worker's values merged (`gateway.base.metrics`; how each gauge merges:
  `gateway.base.metric_naming`). A worker's live gauges leave the view when it exits; the directory is
  removed when the supervisor exits.
- **Stop**: the first SIGTERM or SIGINT closes the drain pipe (the supervisor holds its only write
  end, each worker its read end): every worker drains as on its own first signal
  (`gateway.uvicorn_runner.DrainingServer`), and the supervisor exits when all have, 0 when every
  worker exited 0. A second signal is passed on as SIGTERM: each worker stops at once. A pipe rather
  than a signal, so that a worker which got the signal itself (Ctrl-C reaches the whole process group,
  systemd signals the whole control group) does not take the supervisor's as its second one; and when
  the supervisor dies (SIGKILL), the pipe closes with it and its workers drain rather than serve on
  unsupervised.
- **A worker that exits unasked** (a crash, an OOM kill, a failed start-up) is logged with its exit
  code, the others are drained, and the supervisor exits 1. No restart: the process manager
  (Kubernetes, systemd, Docker's restart policy) restarts the gateway as a whole, as it does a
  one-process gateway, and a start-up that fails does not loop here.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType

from prometheus_client import multiprocess

from gateway.base.metrics import MULTIPROC_DIR_ENV
from gateway.config.settings import Settings
from gateway.ops.local_state import LocalStateServer

logger = logging.getLogger("uvicorn.error")

WorkerMain = Callable[[Settings, str, socket.socket, Connection], None]
"""A worker's entry point: (settings, log level, the listening socket, the read end of the drain pipe);
a module-level function (spawn passes it by name)."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
BALANCED_REUSEPORT = sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")
"""Whether each worker listens on a socket of its own (module docstring, "The socket")."""
WATCH_INTERVAL_S = 0.5
"""How often the supervisor checks on the local state server while it waits for its workers."""


def bind_listener(host: str, port: int) -> socket.socket:
    """The supervisor's socket, bound and never listening (it takes no connection itself; it keeps the
    address reserved until the supervisor exits); OSError when the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP: asyncio turns Nagle off only on sockets of that protocol
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if BALANCED_REUSEPORT:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def worker_listener(inherited: socket.socket) -> socket.socket:
    """A worker's socket to listen on: on Linux its own, bound to the supervisor's address with
    SO_REUSEPORT (the inherited one closed); elsewhere the inherited one."""
    if not BALANCED_REUSEPORT:
        return inherited
    own = socket.socket(inherited.family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    own.bind(inherited.getsockname())
    inherited.close()
    return own


class Supervisor:
    """Starts `count` workers on `sock`, drains them on a signal, exits when they have (module docstring).
    `state_server`: a started local state server that the workers share (their `settings` point at it);
    the supervisor keeps it running and stops it after the last worker, as it closes `sock`."""

    def __init__(
        self,
        settings: Settings,
        log_level: str,
        worker_main: WorkerMain,
        sock: socket.socket,
        count: int,
        *,
        state_server: LocalStateServer | None = None,
    ) -> None:
        self._settings = settings
        self._state_server = state_server
        self._log_level = log_level
        self._worker_main = worker_main
        self._sock = sock
        self._count = count
        self._context = multiprocessing.get_context("spawn")
        self._drain_reader, self._drain_writer = self._context.Pipe(duplex=False)
        self._running: list[BaseProcess] = []
        self._stopping = False
        self._metrics_dir = ""

    def run(self) -> int:
        """Serve until stopped; the exit status (0: every worker drained and exited 0; else 1)."""
        self._metrics_dir = tempfile.mkdtemp(prefix="llm-gateway-metrics-")
        os.environ[MULTIPROC_DIR_ENV] = self._metrics_dir  # inherited by every worker
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            for _ in range(self._count):
                self._start_worker()
            self._drain_reader.close()  # the workers hold the read ends now
            address = self._sock.getsockname()
            logger.info(
                "supervisor %d: %d workers (%s) on %s port %d%s; merged metrics in %s",
                os.getpid(),
                self._count,
                ", ".join(str(p.pid) for p in self._running),
                address[0],
                address[1],
                " (SO_REUSEPORT)" if BALANCED_REUSEPORT else "",
                self._metrics_dir,
            )
            return self._watch()
        finally:
            for process in self._running:  # only after a failure of the supervisor itself
                process.kill()
                process.join()
            self._sock.close()  # held until now: the address stays reserved while a worker binds late
            if self._state_server is not None:  # after the workers: they need it while they drain
                self._state_server.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.environ.pop(MULTIPROC_DIR_ENV, None)
            shutil.rmtree(self._metrics_dir, ignore_errors=True)

    def _start_worker(self) -> None:
        process = self._context.Process(
            target=self._worker_main,
            args=(self._settings, self._log_level, self._sock, self._drain_reader),
            name=f"llm-gateway-worker-{len(self._running)}",
        )
        process.start()
        self._running.append(process)

    def _watch(self) -> int:
        """Wait for the workers to exit, each in turn; the exit status."""
        failed = False
        while self._running:
            by_sentinel = {process.sentinel: process for process in self._running}
            ready_sentinels = wait(list(by_sentinel), WATCH_INTERVAL_S)
            if self._state_server is not None:
                self._state_server.keep_running()
            for ready in ready_sentinels:
                process = by_sentinel[ready]  # type: ignore[index]
                process.join()
                self._running.remove(process)
                multiprocess.mark_process_dead(process.pid, self._metrics_dir)  # type: ignore[no-untyped-call]
                code = process.exitcode
                if code != 0:
                    failed = True
                if self._stopping and code == 0:
                    logger.info("worker %d drained and exited", process.pid)
                elif self._stopping:
                    logger.warning("worker %d exited with code %s", process.pid, code)
                else:
                    logger.error(
                        "worker %d exited unasked (code %s): draining the other %d, then exiting",
                        process.pid,
                        code,
                        len(self._running),
                    )
                    self._drain()
        return 1 if failed else 0

    def _drain(self) -> None:
        """Ask every worker to drain (closes the drain pipe's write end); idempotent."""
        self._stopping = True
        self._drain_writer.close()

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if not self._stopping:
            logger.info("%s: draining %d worker(s)", signal.Signals(sig).name, len(self._running))
            self._drain()
            return
        logger.warning("%s again: stopping the workers at once", signal.Signals(sig).name)
        for process in self._running:
            if process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
