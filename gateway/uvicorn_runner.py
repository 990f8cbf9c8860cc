"""Run the gateway under uvicorn (uvloop + httptools when installed), with a graceful drain on SIGTERM.

First SIGTERM/SIGINT: `GatewayApp.drain()` runs while the listener stays open — readiness fails,
new requests get 503 `draining` with Retry-After (clients and load balancers move on), in-flight
requests get `server.drain_timeout_s` to finish, the rest end with the terminal error — then uvicorn
stops. A second signal stops at once. Kubernetes: give the pod a preStop sleep of about
`readiness_propagation_s` and `terminationGracePeriodSeconds` > preStop + drain_timeout_s + a few s.

Client connections (`gateway.api.connection_guard`): uvicorn runs the guarded httptools protocol —
header deadline, body-deadline backstop, the connection limit with its 503 `connection_limit`; at start
the process's file limit (RLIMIT_NOFILE) is raised to its hard limit where the OS allows, and the
connection limit is held to at most half of it. Both are logged at start.

Once the app has started, the garbage collector is set for serving (`gateway.base.gc_tuning`: what start-up
built is frozen, the youngest generation is collected less often).

`server.workers` > 1 (or `auto`): this process binds the address and supervises that many workers
(`gateway.ops.workers`), each running `_worker_main`: the same server on that address (on Linux a
SO_REUSEPORT socket of its own), which also drains when the supervisor's drain pipe closes. With memory
state it first starts the local state server the workers share (`gateway.ops.local_state`; exit status
3 when it cannot). With 1, `serve` runs the server in this process, as without the setting.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from multiprocessing.connection import Connection
from types import FrameType

import uvicorn

from core.redaction import redact
from gateway.api.connection_guard import guarded_protocol
from gateway.api.connection_limit import ConnectionGuard
from gateway.app import GatewayApp, create_app
from gateway.base.gc_tuning import tune_collector
from gateway.base.metrics import fix_worker_pid
from gateway.config.settings import Settings
from gateway.ops.local_state import LocalStateServer, server_binary, sharing_settings, uses_local_state
from gateway.ops.workers import Supervisor, bind_listener, worker_listener

logger = logging.getLogger("uvicorn.error")  # configured by uvicorn: these lines join its start-up log

STARTUP_FAILURE = 3
"""The exit status when the gateway cannot start (as uvicorn's own: the address cannot be bound)."""
KEEP_ALIVE_S = 75
"""Idle keep-alive connections are closed after this (uvicorn's `timeout_keep_alive`): longer than the
usual 60 s idle timeout of load balancers, so the balancer closes first and never reuses a closing one."""


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains the app before the server stops."""

    def __init__(self, config: uvicorn.Config, app: GatewayApp, drain_pipe: Connection | None = None) -> None:
        """`drain_pipe`: a worker's read end of its supervisor's drain pipe (`gateway.ops.workers`); its
        closing (the supervisor asks, or is gone) counts as the first exit signal."""
        super().__init__(config)
        self._app = app
        self._drain_requested = False
        self._drain_task: asyncio.Task[None] | None = None
        self._drain_pipe = drain_pipe

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_requested:
            super().handle_exit(sig, frame)
            self.force_exit = True
            return
        self._drain_requested = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start-up (the app's lifespan, then the listeners); then the collector is set for
        serving (`gateway.base.gc_tuning`), before the first request is read."""
        await super().startup(sockets)
        if self._drain_pipe is not None:
            asyncio.get_running_loop().add_reader(self._drain_pipe.fileno(), self._supervisor_drains)
        if not self.should_exit:
            tune_collector()

    def _supervisor_drains(self) -> None:
        """The drain pipe closed (readable at its end): drain as on a first signal."""
        if self._drain_pipe is not None:
            asyncio.get_running_loop().remove_reader(self._drain_pipe.fileno())
        self._drain_requested = True

    async def on_tick(self, counter: int) -> bool:
        if self._drain_requested and self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain_then_exit())
        return await super().on_tick(counter)

    async def _drain_then_exit(self) -> None:
        await self._app.drain()
        self.should_exit = True


def raise_file_limit() -> tuple[int, int] | None:
    """Raise the soft RLIMIT_NOFILE to the hard limit where the OS allows; (before, now), or None
    where there is no such limit (not POSIX)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    for candidate in (target, 10240):  # macOS refuses more than kern.maxfilesperproc (often 10240)
        if candidate <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (candidate, hard))
        except (ValueError, OSError):
            continue
        break
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def uvicorn_config(
    app: GatewayApp, settings: Settings, log_level: str = "info", guard: ConnectionGuard | None = None
) -> uvicorn.Config:
    """Server options: the guarded httptools protocol (deadlines and the connection limit; `guard`, or
    one built from the settings without a file limit); Nagle off on accepted sockets (asyncio sets
    TCP_NODELAY); no access log on the hot path; no WebSocket upgrades; uvicorn's own graceful shutdown
    only has to close idle connections after our drain."""
    if guard is None:
        guard = ConnectionGuard.from_settings(settings.server, app.state.metrics, None)
    return uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        http=guarded_protocol(guard),
        ws="none",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=KEEP_ALIVE_S,
        proxy_headers=False,
    )


def serve(settings: Settings, log_level: str = "info") -> int:
    """Run the gateway until it is stopped (module docstring); the exit status."""
    count = settings.server.worker_count()
    if count == 1:
        run_server(settings, log_level)
        return 0
    uvicorn.Config("gateway", log_level=log_level)  # configures the logging of the supervisor's lines
    try:
        sock = bind_listener(settings.server.host, settings.server.port)
    except OSError as exc:
        logger.error("cannot bind %s:%d: %s", settings.server.host, settings.server.port, exc)
        return STARTUP_FAILURE
    state_server = None
    if uses_local_state(count, settings.state.backend):
        try:
            state_server = LocalStateServer(server_binary())
            state_server.start()
        except OSError as exc:
            logger.error("cannot start the local state server: %s", exc)
            sock.close()
            return STARTUP_FAILURE
        logger.info(
            "shared state: local state server (valkey-server, pid %s) at %s (on_error %s)",
            state_server.pid,
            state_server.url,
            settings.state.on_error,
        )
        settings = sharing_settings(settings, state_server.url)
    return Supervisor(settings, log_level, _worker_main, sock, count, state_server=state_server).run()


def _worker_main(settings: Settings, log_level: str, sock: socket.socket, drain_pipe: Connection) -> None:
    """A worker process's entry point (`gateway.ops.workers.WorkerMain`)."""
    fix_worker_pid()  # before the app creates its metrics
    run_server(settings, log_level, worker_listener(sock), drain_pipe)


def run_server(
    settings: Settings,
    log_level: str = "info",
    sock: socket.socket | None = None,
    drain_pipe: Connection | None = None,
) -> None:
    """One gateway server: on `settings.server`'s host and port, or on `sock` (a worker's inherited
    socket), draining on its first exit signal or when `drain_pipe` closes."""
    limits = raise_file_limit()
    app = create_app(settings)
    file_limit = None if limits is None else limits[1]
    guard = ConnectionGuard.from_settings(settings.server, app.state.metrics, file_limit)
    config = uvicorn_config(app, settings, log_level, guard)  # configures uvicorn's logging
    if limits is not None:
        before, now = limits
        logger.info(
            "file limit (RLIMIT_NOFILE) %d%s; client connection limit %d (503 above it, closed at accept "
            "above %d)",
            now,
            f", raised from {before}" if now != before else "",
            guard.max_connections,
            guard.accept_ceiling,
        )
        if guard.max_connections < settings.server.max_connections:
            logger.warning(
                "server.max_connections %d is more than half the file limit %d: %d is used",
                settings.server.max_connections,
                now,
                guard.max_connections,
            )
    log_shared_state(settings)
    DrainingServer(config, app, drain_pipe).run(None if sock is None else [sock])


def log_shared_state(settings: Settings) -> None:
    """The start-up line naming the shared state (Redis's URL with its credentials redacted)."""
    state = settings.state
    if state.backend == "redis":
        logger.info("shared state: Redis at %s (on_error %s)", redact(state.url), state.on_error)
