from __future__ import annotations

import pytest

from gateway.upstream.discovery.endpointslices import endpoint_state, merge_slices, slice_port, slice_states
from gateway.upstream.discovery.types import ReplicaSet, ReplicaState
from tests.unit.discovery.fake_apiserver import endpoint, endpoint_slice


@pytest.mark.parametrize(
    ("conditions", "state"),
    [
        ({}, ReplicaState.READY),  # nil ready means ready
        ({"ready": True}, ReplicaState.READY),
        ({"ready": False}, None),
        ({"ready": False, "serving": True}, None),
        ({"ready": False, "serving": True, "terminating": True}, ReplicaState.DRAINING),
        ({"ready": False, "serving": False, "terminating": True}, ReplicaState.DRAINING),
        ({"ready": True, "terminating": False}, ReplicaState.READY),
    ],
)
def test_endpoint_conditions(conditions: dict[str, bool], state: ReplicaState | None) -> None:
    assert endpoint_state({"addresses": ["127.0.0.1"], "conditions": conditions}) is state


def test_port_by_number_name_or_default() -> None:
    obj = endpoint_slice("s", [], port=8123)
    assert slice_port(obj, 9000) == 9000
    assert slice_port(obj, "http") == 8123
    assert slice_port(obj, "grpc") is None
    assert slice_port(obj, None) == 8123
    obj["ports"].append({"name": "metrics", "port": 9100})
    assert slice_port(obj, None) is None  # ambiguous: name the port


def test_slice_states_ipv6_and_unknown_port() -> None:
    obj = endpoint_slice("s", [endpoint("fd00::1"), endpoint("127.0.0.2", ready=False)])
    assert slice_states(obj, None, "https") == {"https://[fd00::1]:8000": ReplicaState.READY}
    assert slice_states(obj, "nope", "http") == {}


def test_merge_prefers_ready_when_an_address_is_in_two_slices() -> None:
    url = "http://127.0.0.1:8000"
    merged = merge_slices([{url: ReplicaState.DRAINING}, {url: ReplicaState.READY}])
    assert merged == ReplicaSet.of(ready=[url])
    assert merge_slices([{url: ReplicaState.READY}, {url: ReplicaState.DRAINING}]) == merged
