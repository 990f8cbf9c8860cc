"""Wait for the replica that holds the prefix, or spill to a free one? The decision for a queued request.

A request queued in admission is dispatched, when a slot frees, to whichever eligible replica routing
picks; with every replica at its cap (`max_concurrency_per_replica`) the only eligible one is the one
that just freed a slot, whatever prefix it holds. Past a fleet's knee that turns most queued requests
into prefix-cache misses (docs/BENCHMARKS.md, "Queued requests"), and every miss prefills the whole prompt
and evicts another prefix. So, while another replica has a free slot, a request may keep waiting for
its *owner* — the replica the prefix index believes holds most of its prompt — as long as that wait
still lets it meet its TTFT objective.

Inputs: the request's blocks (n = `len(prefix_hashes)`), its `slo_ttft_s`, the pool's views and prefix
index, and what admission knows about the queue (`QueueState`): now, how long it has waited, its queue
deadline (`queue_timeout` at that time), the pool's mean hold time S of a replica slot (dispatch →
release, `admission.release_forecast`), each replica's own mean hold time S_i where it has enough
holds (`admission.hold_times`: 10) and how many waiters ahead of it already wait for each replica.

    candidates  = routable replicas serving the model, not excluded (retries)
    matched_i   = leading request blocks replica i holds (the prefix index)
    worth_it    = matched_i ≥ min_match_ratio × n                 (default ratio 0.5)
    wait only when  some candidate has a free slot  and  no candidate with a free slot is worth it
    owner       = the full candidate with the most matched blocks, worth it (ties: the soonest wait)
    S_owner     = the owner's own mean hold S_i, else S           (no samples yet, or not > 0)
    share       = inflight_owner / batch_owner                    this instance's share of the owner's
                                                                  batch (engine running + waiting, fresh;
                                                                  else its own counts: share 1)
    W           = (ahead_owner + share) × S_owner / inflight_owner
                                                                  expected wait for a slot there (below)
    T           = owner's predicted TTFT with its prefix hit (`router.latency_model`; 0 while cold)
    slack       = min(slo_ttft − waited − W − T,  deadline − now − W)
                  the first term alone while the owner has room at the deadline's last try (below)
    wait ⇔ slack > 0, until now + slack; then it spills (or, if the owner freed first, goes there)

Why W: the owner frees batch / S_i slots per second. The waiters ahead of this request for it are
this instance's `ahead_owner` and, behind several gateway instances, the others' — unknown here, taken
in proportion to the share of the owner's batch each sends: ahead_owner / share in all. So W = (ahead /
share + 1) × S_i / batch, the formula above; with one instance (share 1) it is (ahead + 1) × S_i /
inflight. Counting only this instance's in-flight as the owner's rate (the rule before) made the wait
1 / share times too long for the request's own slot: behind three instances the requests spilled their
prefixes to cold replicas (cache hit 73–76 % against 83–84 % for one instance at 1.5× the knee:
docs/bench-log/2026-12-06-trim-pace.md).

The second term keeps the expected slot before the queue's deadline, so a request never times out
waiting for its owner while a slot elsewhere was free. Where a waiter at its deadline gets a last try
within the headroom a learned cap leaves below the objective (the gateway's `deadline_headroom`:
`QueueState.room_at_deadline`) and the owner has room there now, that try is its owner's slot: the
wait may then run to the deadline and past it, within the TTFT objective. Ended by the deadline term,
such a wait spilled a full cold prefill to another replica while the owner's slot was a step away:
past the knee those spills cost the fleet's cache hit ratio and with it goodput
(docs/bench-log/2026-12-06-knee-first-generation.md). No decision (None) when the request has no
blocks or no TTFT objective, before S is known, when nothing is free elsewhere (it waits anyway: the
pump stops there as before), or when no full replica holds enough of the prompt.

Limits: one S_i for every request on a replica (its recent mix; a replica that serves longer contexts
or misses more shows it in S_i, but a long request among short ones does not); W assumes the owner's
slots go to the waiters holding for it in queue order, while a waiter that holds for nothing may take
one first; T is the model's prediction for a dispatch now, not when the slot frees. Pure and
synchronous: the caller (the gateway's admission) re-asks at every release, so a stale answer
lives at most until the next one or until `until_s`.

Policies that route on a key (`prefix-affinity`, `session-affinity`: the bounded ring) keep no index
to route on, but their owner is where the key maps (`key_owner_wait`): the same rule with that owner,
which is always worth waiting for (no `worth_it` test), its T taken with the blocks the ring's witness
saw go there. Without it a ring spills along the ring whenever its owner is at its cap, so a learned
cap turns the owner's warm prefixes into misses elsewhere (docs/BENCHMARKS.md, "Overload: admission
past the knee"). Why no `worth_it` for a ring: the key's owner is the same for every gateway instance,
so it is where the key's prefix is warm whatever one instance has seen, while the witness sees only
this instance's requests. Gated on the witness, an instance whose share of the owner was full when a
prefix first came spilled it, its witness then credited the owner with none of it, and it went on
spilling that prefix to the next replica on the ring while the other instances sent it to the owner:
one prefix warm on two replicas, each holding fewer of the others (traced behind three instances
without shared state: docs/bench-log/2026-12-06-ring-holds.md). A prefix new to the whole fleet is a
miss anywhere, but sent to its owner it is where its next requests go.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from router.eligibility import is_routable
from router.load import queued_prefill_tokens, running_sequences, waiting_requests
from router.prefix_index import PrefixIndex
from router.profile import KeyOwner
from router.types import ReplicaView, RoutingRequest

DEFAULT_MIN_MATCH_RATIO = 0.5


@dataclass(frozen=True, slots=True)
class QueueState:
    """What admission knows about one queued request (clock seconds; see the module docstring).
    `mean_hold_s_by_replica` holds only replicas with enough holds; the others use `mean_hold_s`."""

    now_s: float
    waited_s: float
    deadline_s: float
    mean_hold_s: float | None
    ahead_by_replica: Mapping[str, int]
    mean_hold_s_by_replica: Mapping[str, float] = field(default_factory=dict)
    room_at_deadline: Callable[[str], bool] | None = None
    """Whether a replica has room for this request within the headroom its deadline's last try may use
    (the gateway's `deadline_headroom`); None: no such try, the wait ends before the deadline."""


@dataclass(frozen=True, slots=True)
class OwnerWait:
    """Wait for `replica_id` until `until_s`; `expected_wait_s` (W) and `predicted_ttft_s` (T) say why."""

    replica_id: str
    until_s: float
    expected_wait_s: float
    predicted_ttft_s: float


def owner_wait(
    request: RoutingRequest,
    replicas: Sequence[ReplicaView],
    index: PrefixIndex,
    queue: QueueState,
    min_match_ratio: float = DEFAULT_MIN_MATCH_RATIO,
) -> OwnerWait | None:
    """Whether `request` should keep waiting for its prefix's owner, and until when (module docstring);
    None: take whatever slot routing finds (spill)."""
    found = _candidates(request, replicas, queue)
    if found is None:
        return None
    candidates, free = found
    needed = min_match_ratio * len(request.prefix_hashes)
    matched = {r.replica_id: index.matched_blocks(r.replica_id, request.prefix_hashes) for r in candidates}
    if any(matched[r.replica_id] >= needed for r in free):
        return None
    best: tuple[int, float, ReplicaView] | None = None
    for replica in candidates:
        held = matched[replica.replica_id]
        if replica.has_free_slot or held < needed or held == 0:
            continue
        wait_s = _expected_wait_s(replica, queue)
        if best is None or (held, -wait_s) > (best[0], -best[1]):
            best = (held, wait_s, replica)
    if best is None:
        return None
    held, wait_s, owner = best
    return _until(owner, request, held, wait_s, queue)


def key_owner_wait(
    request: RoutingRequest, replicas: Sequence[ReplicaView], owner: KeyOwner, queue: QueueState
) -> OwnerWait | None:
    """The same decision for a policy that routes on a key (the rings, `router.bounded`): the owner is
    the key's (`Profile.key_owner`), not the index's best match, and is waited for whenever it is full
    and another candidate is free, whatever the ring's witness saw go there (module docstring); the
    witness's blocks give the owner's predicted TTFT."""
    found = _candidates(request, replicas, queue)
    if found is None:
        return None
    candidates, _ = found
    target = next((r for r in candidates if r.replica_id == owner.replica_id), None)
    if target is None or target.has_free_slot:
        return None
    return _until(target, request, owner.matched_blocks, _expected_wait_s(target, queue), queue)


def _candidates(
    request: RoutingRequest, replicas: Sequence[ReplicaView], queue: QueueState
) -> tuple[list[ReplicaView], list[ReplicaView]] | None:
    """(candidates, those with a free slot) when a wait can be decided at all: the request has blocks
    and a TTFT objective, S is known, and some but not every candidate is free."""
    hold_s = queue.mean_hold_s
    if not request.prefix_hashes or request.slo_ttft_s is None or hold_s is None or hold_s <= 0:
        return None
    candidates = [
        r
        for r in replicas
        if is_routable(r) and r.serves(request.model) and r.replica_id not in request.exclude
    ]
    free = [r for r in candidates if r.has_free_slot]
    if not free or len(free) == len(candidates):  # nothing to spill to, or no owner can be full
        return None
    return candidates, free


def _expected_wait_s(owner: ReplicaView, queue: QueueState) -> float:
    """W = (ahead_owner + share) × S_owner / inflight_owner (module docstring)."""
    ahead = queue.ahead_by_replica.get(owner.replica_id, 0)
    own_hold_s = queue.mean_hold_s_by_replica.get(owner.replica_id)
    hold_s = queue.mean_hold_s or 0.0
    owner_hold_s = own_hold_s if own_hold_s is not None and own_hold_s > 0 else hold_s
    inflight = max(1, owner.inflight_requests)
    batch = max(float(inflight), running_sequences(owner) + waiting_requests(owner))
    return (ahead + inflight / batch) * owner_hold_s / inflight


def _until(
    owner: ReplicaView, request: RoutingRequest, held: int, wait_s: float, queue: QueueState
) -> OwnerWait | None:
    """Wait for `owner` while the slack lasts (module docstring), None when there is none."""
    assert request.slo_ttft_s is not None
    ttft_s = _predicted_ttft_s(owner, request, held)
    slack_s = request.slo_ttft_s - queue.waited_s - wait_s - ttft_s
    deadline_slack_s = queue.deadline_s - queue.now_s - wait_s
    last_try = queue.room_at_deadline
    if deadline_slack_s < slack_s and (last_try is None or not last_try(owner.replica_id)):
        slack_s = deadline_slack_s
    if slack_s <= 0:
        return None
    return OwnerWait(owner.replica_id, queue.now_s + slack_s, wait_s, ttft_s)


def _predicted_ttft_s(replica: ReplicaView, request: RoutingRequest, matched_blocks: int) -> float:
    """The replica's learned TTFT for `request` with `matched_blocks` cached; 0 while its model is cold."""
    if replica.latency is None:
        return 0.0
    queued = queued_prefill_tokens(replica, request, matched_blocks)
    own = request.uncached_tokens(matched_blocks)
    running, waiting = running_sequences(replica), waiting_requests(replica)
    predicted = replica.latency.ttft_s(queued, running, waiting, own, replica.since_last_token_s)
    return 0.0 if predicted is None else predicted
