"""Real connection refusal for the `refuse_connections` fault: pause and resume a uvicorn server's listeners.

Pausing closes the server's asyncio servers (the event loop stops watching the listening sockets) while a
duplicate descriptor keeps each socket alive, then `shutdown(SHUT_RD)` takes the socket out of the LISTEN
state (Linux): it stays bound, so the port stays ours, but nothing listens on it and the kernel answers new
connections with RST: the client gets ECONNREFUSED, exactly as when no server runs. Idle keep-alive
connections are closed and in-flight requests finish without keep-alive (uvicorn's own shutdown
of a connection), so pooled clients must reconnect and are refused too. Resuming calls `listen()` again on
the same socket and serves it with a new asyncio server built like uvicorn's.
Where `shutdown()` on a listening socket is not supported, the socket is closed and a new one is bound to the
same address on resume.

The uvicorn `Server` is found among the running tasks (the coroutine `Server.serve` whose config serves this
app) or given explicitly with `attach()`. Meant for one server process (the mock engine runs no workers): the
listening socket is shared by every process that inherited it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any

import uvicorn

_MAX_AWAIT_DEPTH = 32


def find_uvicorn_server(app: object) -> uvicorn.Server | None:
    """The running uvicorn `Server` serving `app` (or the only running one), from the event loop's tasks."""
    found: list[uvicorn.Server] = []
    for task in asyncio.all_tasks():
        coro: Any = task.get_coro()
        for _ in range(_MAX_AWAIT_DEPTH):
            frame = getattr(coro, "cr_frame", None)
            owner = frame.f_locals.get("self") if frame is not None else None
            if isinstance(owner, uvicorn.Server):
                if owner.config.app is app:
                    return owner
                found.append(owner)
                break
            coro = getattr(coro, "cr_await", None)
            if coro is None:
                break
    return found[0] if len(found) == 1 else None


class ListenerGate:
    """Stops and restarts accepting connections on a uvicorn server (see the module docstring)."""

    def __init__(self, server: uvicorn.Server | None = None) -> None:
        self._server = server
        self._held: list[tuple[socket.socket | None, Any, int]] = []  # (socket, address, family)
        self._paused = False

    def attach(self, server: uvicorn.Server) -> None:
        self._server = server

    @property
    def available(self) -> bool:
        return self._server is not None

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def started(self) -> bool:
        return self._server is not None and bool(self._server.started)

    @property
    def shutting_down(self) -> bool:
        return self._server is not None and bool(self._server.should_exit)

    async def pause(self) -> None:
        server = self._require()
        if self._paused:
            return
        held: list[tuple[socket.socket, Any, int]] = []
        for listener in server.servers:
            for transport_socket in listener.sockets:
                dup = socket.socket(fileno=os.dup(transport_socket.fileno()))
                held.append((dup, dup.getsockname(), dup.family))
            listener.close()
        server.servers.clear()
        self._held = [_stop_listening(*entry) for entry in held]
        self._paused = True
        for connection in list(server.server_state.connections):
            connection.shutdown()

    async def resume(self) -> None:
        server = self._require()
        if not self._paused:
            return
        config = server.config
        state, lifespan_state = server.server_state, server.lifespan.state

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            protocol: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=state, app_state=lifespan_state, _loop=_loop
            )
            return protocol

        loop = asyncio.get_running_loop()
        held, self._held, self._paused = self._held, [], False
        for sock, address, family in held:
            listening = sock if sock is not None else _bound_socket(family, address)
            listening.listen(config.backlog)
            listener = await loop.create_server(
                create_protocol, sock=listening, ssl=config.ssl, backlog=config.backlog
            )
            server.servers.append(listener)

    def close(self) -> None:
        """Release sockets held while paused (at shutdown)."""
        for sock, _, _ in self._held:
            if sock is not None:
                sock.close()
        self._held = []

    def _require(self) -> uvicorn.Server:
        if self._server is None:
            raise RuntimeError("no uvicorn server to pause or resume")
        return self._server


def _stop_listening(sock: socket.socket, address: Any, family: int) -> tuple[socket.socket | None, Any, int]:
    try:
        sock.shutdown(socket.SHUT_RD)  # Linux: leaves LISTEN, stays a bound socket
    except OSError:
        sock.close()
        return None, address, family
    with contextlib.suppress(OSError):
        sock.bind(address)  # the port is released when it was picked by the kernel (port 0): take it back
    return sock, address, family


def _bound_socket(family: int, address: Any) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    return sock
