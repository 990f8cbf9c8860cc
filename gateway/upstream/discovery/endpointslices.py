"""Pure translation of discovery.k8s.io/v1 EndpointSlices into replica states (no I/O).

Per endpoint, following the API's conventions (`ready` nil means true, `terminating` nil means false):
- `terminating: true` → `draining` (whatever `ready`/`serving` say: the pod is going away; in-flight
  requests finish, it gets no new ones);
- otherwise `ready: false` → excluded (absent: the registry drains it and drops it once idle);
- otherwise → `ready`.
An address listed by two slices (an endpoint moving between slices) is `ready` if either says so.

The port: an int is used as is (the container port the engine listens on); a string names a port of
the Service (looked up in each slice's `ports`); None takes the slice's only port.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.upstream.discovery.types import ReplicaSet, ReplicaState, format_url

SliceStates = dict[str, ReplicaState]


def slice_port(obj: Mapping[str, Any], port: int | str | None) -> int | None:
    """The port to use for this slice's endpoints, or None when it cannot be determined."""
    if isinstance(port, int):
        return port
    ports = [p for p in obj.get("ports") or [] if isinstance(p, dict) and isinstance(p.get("port"), int)]
    if port is None:
        return ports[0]["port"] if len(ports) == 1 else None
    return next((p["port"] for p in ports if p.get("name") == port), None)


def endpoint_state(endpoint: Mapping[str, Any]) -> ReplicaState | None:
    conditions = endpoint.get("conditions") or {}
    if conditions.get("terminating") is True:
        return ReplicaState.DRAINING
    if conditions.get("ready") is False:
        return None
    return ReplicaState.READY


def slice_states(obj: Mapping[str, Any], port: int | str | None, scheme: str) -> SliceStates:
    """The replica states one EndpointSlice contributes."""
    number = slice_port(obj, port)
    if number is None:
        return {}
    states: SliceStates = {}
    for endpoint in obj.get("endpoints") or []:
        state = endpoint_state(endpoint)
        if state is None:
            continue
        for address in endpoint.get("addresses") or []:
            states[format_url(scheme, str(address), number)] = state
    return states


def merge_slices(slices: Iterable[SliceStates]) -> ReplicaSet:
    merged: SliceStates = {}
    for states in slices:
        for url, state in states.items():
            if merged.get(url) is not ReplicaState.READY:
                merged[url] = state
    return ReplicaSet(merged)
