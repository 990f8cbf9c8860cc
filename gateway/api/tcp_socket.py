"""What the gateway asks the kernel about a client's TCP socket (Linux where noted).

`tcp_progress` reads how far the client has acknowledged what was sent (TCP_INFO `tcpi_bytes_acked`),
how much waits in the send queue (SIOCOUTQ: sent but unacknowledged, and unsent) and how much of it the
kernel could not send yet (`tcpi_notsent_bytes`: the client's window is closed or the link is the
limit): the write watch of `gateway.api.connection_guard`.
`reset_on_close` makes the next close a reset (SO_LINGER 0 s), so a connection dropped while the client
is not reading frees its buffers at once instead of being flushed for ever by the kernel.
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import sys
import termios
from typing import Any

_TCP_INFO_BYTES_ACKED = slice(120, 128)
"""`tcpi_bytes_acked` (u64, Linux ≥ 4.1) in `struct tcp_info`."""
_TCP_INFO_NOTSENT_BYTES = slice(144, 148)
"""`tcpi_notsent_bytes` (u32, Linux ≥ 4.6) in `struct tcp_info`."""
_LINGER_RESET = struct.pack("ii", 1, 0)
WATCHES_WRITES = sys.platform == "linux" and hasattr(socket, "TCP_INFO") and hasattr(termios, "TIOCOUTQ")
"""Whether `tcp_progress` can answer on this platform."""


def tcp_progress(sock: Any) -> tuple[int, int, int] | None:
    """(bytes the peer acknowledged, bytes in the kernel's send queue, bytes of it not sent yet) of a
    TCP socket (Linux; the last is 0 on kernels before 4.6), or None when the kernel does not tell
    (another platform, not TCP)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
        queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, AttributeError):
        return None
    if len(info) < _TCP_INFO_BYTES_ACKED.stop:
        return None
    acked = int.from_bytes(info[_TCP_INFO_BYTES_ACKED], sys.byteorder)
    unsent_bytes = info[_TCP_INFO_NOTSENT_BYTES]
    unsent = int.from_bytes(unsent_bytes, sys.byteorder) if len(unsent_bytes) == 4 else 0
    return acked, int.from_bytes(queued, sys.byteorder, signed=True), unsent


def reset_on_close(sock: Any) -> None:
    """Make closing `sock` send a reset and discard what is unsent (best effort)."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
