"""Poison containment across requests: quarantine and charging that need no second try.

Failure attribution (`gateway.proxy.failure_attribution`) tells a poison request inside one request: the
same failure on two replicas that keep serving others, with no load evidence. That needs a second try,
which `max_attempts: 1` or a spent retry budget refuses. The containment adds the same rule across
identical requests (one fingerprint, `gateway.proxy.stores.quarantine.fingerprint`), with the evidence of
`gateway.proxy.stores.poison_evidence` (where each fingerprint failed, within `attribution.window_s`):

- **sighted**: a request that ends unserved leaves a sighting for each failure that was neither load
  nor on a replica that serves nobody (`RequestFailures.sighted`); a request served anywhere clears its
  fingerprint's sightings.
- **quarantined**: a failure that repeats a sighting of its fingerprint as a poison request's second
  failure would (`RequestFailures.repeated_elsewhere`: same kind, another replica that keeps serving
  others and is not down, neither shows load) quarantines the fingerprint like the in-request rule —
  at the failure (the request is answered 422 `request_quarantined`, no further try), or when the
  request ends and its sighting completes the evidence (it keeps its own error; identical ones are
  refused at arrival from then on).
- **rerouted**: an arriving request whose fingerprint failed on some replicas is routed away from them
  while another routable replica remains, so an identical request tries a replica where it did not
  fail — with prefix-affinity routing it would otherwise go back to the same one for ever.
- **held**: a failure of an unserved request that would be its replica's is not charged at once
  (`RequestFailures.held`): it waits up to `attribution.hold_s` (10 s). It is the request's as soon as
  its fingerprint is quarantined, and at the end of the hold when the fingerprint failed the same way on
  another replica or the replica delivered another response since; otherwise the replica's (or load's
  on load evidence then). So a replica whose failures are all on fingerprints that fail elsewhere too
  is never charged for them, and a replica that broke is charged `hold_s` late when no request can be
  retried elsewhere (a request retried and served elsewhere charges it at once, as before). Holds are
  settled when a request of the pool ends.

A disaggregated pool's request holds a replica of each set (`gateway.proxy.legs`): each set keeps its
own attribution, evidence and holds (a failure is judged among the replicas of its set), and the
request carries one fingerprint, the client-facing pool's, whose quarantine is one store the sets
share — a poison request quarantined by the failures of either set is refused at arrival. Rerouting
applies per set.

`llm_gateway_quarantine_total{model,outcome}` (the client-facing pool's model): `quarantined` (answered
422 at a failure), `listed` (quarantined at a request's end), `refused` (at arrival), `rerouted` (routed
away from where it failed). A pool with `quarantine.enabled: false` has none of this: no fingerprint is
computed, failures settle at the request's end as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from admission.ticket import SlotRole
from core.clock import Clock
from core.shared_state import RedisBackend
from gateway.base.errors import RequestQuarantined, UpstreamError
from gateway.base.metrics import GatewayMetrics
from gateway.proxy.context import RequestContext
from gateway.proxy.failure_attribution import PoolAttribution, RequestFailures
from gateway.proxy.failure_charges import Charge, FailureCause, Pending, Verdict
from gateway.proxy.retry_policy import failure_kind
from gateway.proxy.stores.poison_evidence import EvidenceStore, MemoryEvidence, Sighting
from gateway.proxy.stores.poison_evidence_redis import RedisEvidence
from gateway.proxy.stores.quarantine import MemoryQuarantine, QuarantineStore, fingerprint
from gateway.proxy.stores.quarantine_redis import RedisQuarantine, Synced
from gateway.upstream.failure_kinds import FailureKind
from gateway.upstream.registry import Pool
from gateway.upstream.replica import Replica


@dataclass(slots=True)
class _Held:
    failures: RequestFailures
    pending: Pending
    until_s: float


@dataclass(slots=True)
class PoolContainment:
    """One pool's (or set's) attribution, quarantine and evidence (no quarantine or evidence:
    disabled), and the failures it holds. A prefill set's quarantine is its pool's."""

    attribution: PoolAttribution
    quarantine: QuarantineStore | None = None
    evidence: EvidenceStore | None = None
    held: deque[_Held] = field(default_factory=deque)
    """In the order they are due (one `hold_s` per pool)."""


def _elsewhere(sightings: tuple[Sighting, ...]) -> list[tuple[str, FailureKind]]:
    return [(s.replica_id, s.kind) for s in sightings]


class Containment:
    """The serve path's poison containment (module docstring); one per app, a `PoolContainment` per pool."""

    def __init__(self, pools: dict[str, PoolContainment], metrics: GatewayMetrics, clock: Clock) -> None:
        self._pools = pools
        self._metrics = metrics
        self._clock = clock

    def attribution(self, model: str) -> PoolAttribution:
        return self._pools[model].attribution

    def arrive(
        self, ctx: RequestContext, sets: Mapping[SlotRole, Pool]
    ) -> tuple[RequestContext, dict[SlotRole, RequestFailures]]:
        """The request's failure record on each of its sets (`sets`: the pool's, by role); 422 at once
        when its fingerprint is quarantined; the context routed away from the replicas of each set where
        the fingerprint failed (while another routable one of that set remains)."""
        failures = {role: self._pools[s.model].attribution.for_request() for role, s in sets.items()}
        quarantine = self._pools[ctx.model].quarantine
        evidence = [(s, self._pools[s.model].evidence) for s in sets.values()]
        sighted = any(seen is not None and seen.active for _, seen in evidence)
        if quarantine is None or not (quarantine.active or sighted):
            return ctx, failures
        key = fingerprint(ctx.parsed, ctx.model)
        for each in failures.values():
            each.fingerprint = key
        if quarantine.contains(key):
            self._count(ctx, "refused")
            raise RequestQuarantined(
                "an identical request broke two replicas and is quarantined: it is not sent again "
                f"(for up to {ctx.pool.settings.quarantine.ttl_s:g} s)"
            )
        now_s = self._clock.now_s()
        exclude = ctx.routing.exclude
        for side, seen in evidence:
            avoid = frozenset(s.replica_id for s in seen.sightings(key)) if seen is not None else frozenset()
            if not avoid:
                continue
            candidate = exclude | avoid
            if any(r.routable_at(now_s) for r in side.replicas.values() if r.replica_id not in candidate):
                exclude = candidate
        if exclude == ctx.routing.exclude:
            return ctx, failures
        self._count(ctx, "rerouted")
        return replace(ctx, routing=replace(ctx.routing, exclude=exclude)), failures

    async def judge(
        self,
        ctx: RequestContext,
        failures: RequestFailures,
        failure: UpstreamError,
        replica: Replica,
        side: Pool,
    ) -> Verdict:
        """Classify one failed try on `replica` of set `side` (the request's pool, or a set of it): the
        in-request rule, then the fingerprint's sightings elsewhere in the set."""
        pool = self._pools[side.model]
        if pool.quarantine is not None and failures.fingerprint is None:
            failures.fingerprint = fingerprint(ctx.parsed, ctx.model)
        kind = failure_kind(failure)
        verdict = failures.record(kind, replica, side)
        key = failures.fingerprint
        if verdict.quarantine and key is not None:
            return replace(verdict, charges=(*verdict.charges, *self._release(pool, key)))
        if not verdict.pending or kind is None or key is None or pool.evidence is None:
            return verdict
        if not failures.repeated_elsewhere(kind, replica, side, _elsewhere(pool.evidence.sightings(key))):
            return verdict
        failures.withdraw_last()
        await pool.evidence.add(key, replica.replica_id, kind)  # where it failed, for the others' holds
        failures.stalls.forget(failures.key)
        charges = (Charge(replica, kind, FailureCause.REQUEST), *self._release(pool, key))
        return Verdict(charges, quarantine=True)

    async def quarantine(
        self, ctx: RequestContext, failures: RequestFailures, failure: UpstreamError
    ) -> RequestQuarantined:
        """Quarantine the request's fingerprint and return the 422 that answers it."""
        pool = self._pools[ctx.model]
        if pool.quarantine is not None and failures.fingerprint is not None:
            await pool.quarantine.add(failures.fingerprint)
        self._count(ctx, "quarantined")
        return RequestQuarantined(
            f"the request failed the same way on two replicas that keep serving other requests "
            f"({failure.code}: {failure.message}); it is quarantined and not sent to a third"
        )

    async def settle(
        self, ctx: RequestContext, failures: RequestFailures, side: Pool, *, served: bool
    ) -> tuple[Charge, ...]:
        """The request ended: its pending failures on set `side` charged or held, its sightings there
        recorded (or its fingerprint's cleared, when served), and the set's holds that are due settled."""
        pool = self._pools[side.model]
        charges = list(failures.settle(served=served))
        key, evidence = failures.fingerprint, pool.evidence
        if key is not None and evidence is not None:
            if served and evidence.sightings(key):
                await evidence.clear(key)
            listed = False
            for sighted in failures.sighted:
                found = await evidence.add(key, sighted.replica.replica_id, sighted.kind)
                repeated = failures.repeated_elsewhere(sighted.kind, sighted.replica, side, _elsewhere(found))
                listed = listed or repeated
            until_s = self._clock.now_s() + side.settings.attribution.hold_s
            pool.held.extend(_Held(failures, held, until_s) for held in failures.held)
            failures.sighted.clear()
            failures.held.clear()
            if listed and pool.quarantine is not None:
                await pool.quarantine.add(key)
                self._count(ctx, "listed")
                charges.extend(self._release(pool, key))
        charges.extend(self._due(pool))
        return tuple(charges)

    def _release(self, pool: PoolContainment, key: str) -> list[Charge]:
        """The held failures of fingerprint `key`, now the request's (it is quarantined)."""
        mine = [h for h in pool.held if h.failures.fingerprint == key]
        if not mine:
            return []
        pool.held = deque(h for h in pool.held if h.failures.fingerprint != key)
        return [h.failures.resolve_held(h.pending, failed_elsewhere=True) for h in mine]

    def _due(self, pool: PoolContainment) -> list[Charge]:
        """Settle the holds that are due (module docstring)."""
        now_s = self._clock.now_s()
        charges = []
        while pool.held and pool.held[0].until_s <= now_s:
            h = pool.held.popleft()
            key = h.failures.fingerprint or ""  # only requests with a fingerprint hold failures
            quarantined = pool.quarantine is not None and pool.quarantine.contains(key)
            sightings = pool.evidence.sightings(key) if pool.evidence is not None else ()
            elsewhere = quarantined or any(
                s.replica_id != h.pending.replica.replica_id and s.kind is h.pending.kind for s in sightings
            )
            charges.append(h.failures.resolve_held(h.pending, failed_elsewhere=elsewhere))
        return charges

    def _count(self, ctx: RequestContext, outcome: str) -> None:
        self._metrics.quarantine_total.labels(ctx.model, outcome).inc()


def build_containment(
    pools: Iterable[Pool], backend: RedisBackend | None, clock: Clock, metrics: GatewayMetrics
) -> tuple[Containment, list[Synced]]:
    """Every pool's (and prefill set's) containment — attribution always; quarantine and evidence when
    the pool's quarantine is enabled, in Redis with `backend` (memory without), a prefill set sharing its
    pool's quarantine — and the Redis stores whose mirrors the caller keeps in sync
    (`gateway.proxy.stores.quarantine_redis.QuarantineSync`)."""
    pools = list(pools)
    built: dict[str, PoolContainment] = {}
    synced: list[Synced] = []
    for pool in pools:
        s = pool.settings
        entry = built[pool.model] = PoolContainment(PoolAttribution(s.attribution, clock))
        if not s.quarantine.enabled:
            continue
        ttl_s, window_s, cap = s.quarantine.ttl_s, s.attribution.window_s, s.quarantine.max_entries
        if backend is None:
            entry.evidence = MemoryEvidence(clock, window_s, cap)
            entry.quarantine = MemoryQuarantine(clock, ttl_s, cap) if pool.client_facing else None
            continue
        evidence = RedisEvidence(backend, pool.model, clock, window_s=window_s, max_entries=cap)
        entry.evidence = evidence
        synced.append(evidence)
        if pool.client_facing:
            quarantine = RedisQuarantine(backend, pool.model, clock, ttl_s=ttl_s, max_entries=cap)
            entry.quarantine = quarantine
            synced.append(quarantine)
    for pool in pools:
        if pool.prefill is not None and pool.prefill.model in built:
            built[pool.prefill.model].quarantine = built[pool.model].quarantine
    return Containment(built, metrics, clock), synced
