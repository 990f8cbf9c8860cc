"""The request id: the client's `x-request-id` when it sent one, else 32 random hex digits.

Every proxied answer and every error answer carries it (contract errors from the proxy and from the
operations routes, 404 and 405 included; not the operations routes' own 200s) and it is sent upstream,
so one id follows a request through logs and engines.
"""

from __future__ import annotations

import os


def request_id_of(client_value: str | None) -> str:
    """The client's id when non-empty, else a new random one."""
    return client_value or os.urandom(16).hex()
