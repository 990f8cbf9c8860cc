"""One snapshot of the pool per dispatch attempt: the `try_dispatch` right after `prefer_wait` for the
same request routes on the views `prefer_wait` took; any other call takes its own, so a change in
between is never routed past; and the decisions are those of a pool that takes a snapshot per call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from admission.holds import WaitContext
from admission.tenants import Tenant
from admission.ticket import AdmissionRequest
from gateway.config.settings import parse_settings
from gateway.proxy.admit import PoolAdmission
from gateway.upstream.registry import ReplicaRegistry
from router.keys import build_routing_request
from tests.unit.gateway.in_memory_admission import pool_admission

MODEL = "m"
URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]


def admission_of(prefix_wait: bool = True) -> tuple[PoolAdmission, ReplicaRegistry, list[int]]:
    """Three replicas with a cap of 2 (prefix-index, the default); the counter of snapshots taken."""
    pool: dict[str, Any] = {"model": MODEL, "replicas": {"static": URLS}, "max_concurrency_per_replica": 2}
    pool["prefix_wait"] = {"enabled": prefix_wait}
    admission, registry = pool_admission(parse_settings({"pools": [pool]}), MODEL)
    taken = [0]
    snapshot: Callable[..., Any] = admission.pool.snapshot

    def counted(*args: Any) -> Any:
        taken[0] += 1
        return snapshot(*args)

    admission.pool.snapshot = counted  # type: ignore[method-assign]
    return admission, registry, taken


def request(i: int) -> AdmissionRequest:
    prompt = f"shared system prompt {i % 3} " * 40 + f"question {i}"
    return AdmissionRequest(Tenant("t"), "interactive", 100, build_routing_request(MODEL, prompt))


def context() -> WaitContext:
    return WaitContext(0.0, 0.0, 10.0, None, {}, {})


def test_views_kept_for_one_request_are_not_routed_on_for_another_after_a_change() -> None:
    admission, registry, taken = admission_of()
    first, second = request(1), request(2)
    assert admission.prefer_wait(first, context()) is None and taken[0] == 1
    for replica in registry.pools[MODEL].replicas.values():
        replica.inflight_requests = 2  # every replica full since those views were taken
    assert admission.try_dispatch(second) is None, "another request: a fresh snapshot, nothing free"
    assert admission.try_dispatch(first) is None, "the kept views went with the call in between"
    assert taken[0] == 1 + 2 + 2  # each try: its routing's snapshot and has_eligible_replica's


def test_a_second_try_of_the_same_request_takes_a_fresh_snapshot() -> None:
    admission, registry, taken = admission_of()
    first = request(1)
    assert admission.prefer_wait(first, context()) is None
    slot = admission.try_dispatch(first)
    assert slot is not None and taken[0] == 1, "the try right after prefer_wait: its views"
    for replica in registry.pools[MODEL].replicas.values():
        replica.inflight_requests = 2
    assert admission.try_dispatch(first) is None and taken[0] == 1 + 2
    slot.release()


async def test_an_admitted_request_is_routed_on_one_snapshot_to_where_a_fresh_one_sends_it() -> None:
    shared, _, taken = admission_of(prefix_wait=True)
    fresh, _, _ = admission_of(prefix_wait=False)  # no hook: try_dispatch takes its own snapshot
    held = []
    for i in range(6):  # 6 of the 3 × 2 slots: the prefix index and the loads steer every choice
        one, other = await shared.admit(request(i)), await fresh.admit(request(i))
        assert taken[0] == i + 1
        a, b = one.slot(), other.slot()
        assert a is not None and b is not None and a.replica.replica_id == b.replica.replica_id
        held += [one, other]
    for ticket in held:
        await ticket.release()
