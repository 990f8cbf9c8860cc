"""A disaggregated pool's claim: both sets decide, and only a pair that is claimed is recorded in the
prefill set's prefix index — a request waiting for decode room never meets its own unsent prefill."""

from __future__ import annotations

import asyncio
import random

from admission.tenant_gate import TenantGate
from admission.tenants import Tenant
from admission.ticket import AdmissionRequest, SlotRole
from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.proxy.admission_assembly import build_admission
from gateway.proxy.disagg.admit import PairAdmission, add_pair_admissions
from gateway.proxy.route import Router
from gateway.upstream.registry import ReplicaRegistry
from gateway.upstream.slot import Slot
from router.keys import build_routing_request
from router.prefix_index import PrefixIndex, policy_prefix_index

MODEL = "m"
PREFILL = [f"http://10.0.1.{n}:8000" for n in (1, 2)]
DECODE = ["http://10.0.2.1:8000"]
PROMPT = "s" * 4096  # 64 blocks


def pair_admission(
    decode_cap: int | None = 1, upstream_connections: int | None = None, clock: FakeClock | None = None
) -> tuple[PairAdmission, PrefixIndex]:
    """The pair admission of a pool with two prefill replicas (prefix-index) and one decode replica
    taking `decode_cap` requests at a time, and the prefill set's prefix index; the process's upstream
    connection limit at `upstream_connections` (the default when None); `clock` (a fake one at 0)."""
    decode: dict[str, object] = {"replicas": {"static": DECODE}}
    if decode_cap is not None:
        decode["max_concurrency_per_replica"] = decode_cap
    raw: dict[str, object] = {
        "pools": [
            {
                "model": MODEL,
                "disaggregation": {
                    "protocol": "vllm",
                    "prefill": {"replicas": {"static": PREFILL}, "policy": "prefix-index"},
                    "decode": decode,
                },
            }
        ]
    }
    if upstream_connections is not None:
        raw["upstream"] = {"max_connections": upstream_connections}
    settings = parse_settings(raw)
    clock = clock or FakeClock(0.0)
    metrics = GatewayMetrics()
    registry = ReplicaRegistry(settings, metrics, clock, random.Random(1))
    gate = TenantGate.in_memory(clock)
    admission = build_admission(
        settings, registry=registry, router=Router(metrics), gate=gate, clock=clock, metrics=metrics
    )
    add_pair_admissions(admission, settings, registry=registry, gate=gate, clock=clock, metrics=metrics)
    pair = admission.pair(MODEL)
    index = policy_prefix_index(pair.prefill.pool.policy)
    assert index is not None
    return pair, index


def inflight(pair: PairAdmission) -> int:
    """Requests in flight on both sets' replicas."""
    replicas = (*pair.prefill.pool.replicas.values(), *pair.decode.pool.replicas.values())
    return sum(r.inflight_requests for r in replicas)


def test_a_pair_refused_for_decode_room_records_nothing_in_the_prefill_index() -> None:
    pair, index = pair_admission()
    first = pair.claim_pair(build_routing_request(MODEL, "other " * 800))
    assert first is not None, "the decode replica's one slot is taken"
    held = {rid: index.blocks(rid) for rid in index.replica_ids()}
    routing = build_routing_request(MODEL, PROMPT)
    for _ in range(3):  # the request waits and decides again at each release
        assert pair.claim_pair(routing) is None
    assert {rid: index.blocks(rid) for rid in index.replica_ids()} == held, "nothing recorded for it"
    first.release()
    second = pair.claim_pair(routing)
    assert second is not None
    prefill_id = second.roles[SlotRole.PREFILL].replica.replica_id
    assert second.roles[SlotRole.PREFILL].decision.detail.get("matched_prefix_blocks") == 0, (
        "its prefill is not counted as cached"
    )
    assert index.matched_blocks(prefill_id, routing.prefix_hashes) == len(routing.prefix_hashes)
    second.release()


def test_a_claimed_pair_is_recorded_once_where_its_prefill_went() -> None:
    """One record per claimed pair (counted by the index's listener, which prefix sharing uses), on the
    prefill replica; the next request with the same prompt finds it there."""
    pair, index = pair_admission()
    records: list[str] = []
    index.listen(lambda replica_id, _hashes: records.append(replica_id))
    routing = build_routing_request(MODEL, PROMPT)
    first = pair.claim_pair(routing)
    assert first is not None
    assert records == [first.roles[SlotRole.PREFILL].replica.replica_id]
    first.release()
    again = pair.claim_pair(routing)
    assert again is not None
    assert (
        again.roles[SlotRole.PREFILL].replica.replica_id == first.roles[SlotRole.PREFILL].replica.replica_id
    )
    assert again.roles[SlotRole.PREFILL].decision.detail.get("matched_prefix_blocks") == len(
        routing.prefix_hashes
    )
    assert records == [first.roles[SlotRole.PREFILL].replica.replica_id] * 2
    again.release()


async def test_admission_gives_a_ticket_holding_both_slots_by_role() -> None:
    """The ticket a disaggregated pool's admission returns is complete: its PREFILL and DECODE slots in
    their roles, nothing in SERVE (no pair to hand over)."""
    pair, _ = pair_admission()
    routing = build_routing_request(MODEL, PROMPT)
    ticket = await pair.admit(AdmissionRequest(Tenant("t"), "interactive", 10, routing))
    assert set(ticket.slots) == {SlotRole.PREFILL, SlotRole.DECODE}
    assert all(isinstance(slot, Slot) for slot in ticket.slots.values())
    assert ticket.slot(SlotRole.PREFILL).replica.replica_id in {p.removeprefix("http://") for p in PREFILL}
    await ticket.release()
    assert inflight(pair) == 0


async def test_a_pair_counts_as_two_under_the_upstream_connection_limit() -> None:
    """With 3 upstream connections and one pair holding 2, the next pair (2 more) is not claimed — it
    would hold 4 — and the pool is not full by its own caps (early refusal stays out); a queued pair
    request is dispatched when the first pair's slots are released."""
    pair, _ = pair_admission(decode_cap=None, upstream_connections=3)
    first = pair.claim_pair(build_routing_request(MODEL, "other " * 800))
    assert first is not None
    assert pair.claim_pair(build_routing_request(MODEL, PROMPT)) is None
    assert pair.prefill.connections_free(1), "one connection is left for a single request"
    assert not pair.pair_fits()
    assert inflight(pair) == 2
    waiting = asyncio.create_task(
        pair.admit(AdmissionRequest(Tenant("t"), "interactive", 10, build_routing_request(MODEL, PROMPT)))
    )
    await asyncio.sleep(0)
    assert not waiting.done(), "it waits for connections rather than taking a third and fourth"
    first.release()  # the registry's release listener wakes the pair's queue
    ticket = await asyncio.wait_for(waiting, 1.0)
    assert set(ticket.slots) == {SlotRole.PREFILL, SlotRole.DECODE}
    await ticket.release()
    assert pair.pair_fits()


async def test_at_the_connection_limit_a_pair_arrival_queues_rather_than_being_refused_early() -> None:
    """Early refusal forecasts from the pool's own tickets only while the pool is full by its own caps.
    With 3 upstream connections and a pair holding 2 for a long time (the last one held 100 s), one
    connection is free but no pair fits: the limit, shared with every pool, is what blocks, so an arrival
    whose forecast wait is hopeless still queues, and is dispatched at the release."""
    clock = FakeClock(0.0)
    pair, _ = pair_admission(decode_cap=None, upstream_connections=3, clock=clock)

    def request() -> AdmissionRequest:
        return AdmissionRequest(Tenant("t"), "interactive", 10, build_routing_request(MODEL, PROMPT))

    earlier = await pair.admit(request())
    clock.advance(100.0)
    await earlier.release()
    held = await pair.admit(request())
    arrival = asyncio.create_task(pair.admit(request()))
    await asyncio.sleep(0)
    assert not arrival.done(), "queued, not refused on a forecast of the pool's own releases"
    await held.release()
    ticket = await asyncio.wait_for(arrival, 1.0)
    await ticket.release()
    assert inflight(pair) == 0
