"""Routing, as the serve path calls it: one pure decision over a pool's snapshot, plus its metrics.

`Router.decide(pool, routing)` takes the pool's frozen snapshot (`Pool.snapshot`), asks the pool's
policy (`router/`: filters → weighted scorers → picker) and counts the outcome:
`llm_gateway_routing_decision_seconds` (time to decide) and `routing_decisions_total{policy,branch}`.
A request pinned to the replica holding its stored state (`RoutingRequest.pinned`) is decided by the
policy as any other, over that one replica, and its branch is `pinned`.
It never claims anything, records nothing and never does I/O (`commit` records a decision once it is
claimed); `None` means no replica is eligible for this request
now (all at their cap, excluded, or not routable). Claiming the chosen replica is admission's step
(`gateway.proxy.admit.PoolAdmission.claim`), sending to it the upstream client's
(`gateway.proxy.send.UpstreamClient`).
"""

from __future__ import annotations

import time
from dataclasses import replace

from gateway.base.metrics import GatewayMetrics
from gateway.observability.metric_children import Children
from gateway.upstream.registry import Pool
from router.types import Branch, Decision, ReplicaView, RoutingRequest


class Router:
    """The routing facade of the serve path (see the module docstring)."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics
        self._decisions = Children(metrics.routing_decisions_total)

    def decide(
        self, pool: Pool, routing: RoutingRequest, views: tuple[ReplicaView, ...] | None = None
    ) -> Decision | None:
        """The pool policy's decision for `routing` over `views` (the pool's snapshot for
        `routing.cap_share`, taken in the same synchronous step: nothing may have changed since) or,
        without them, over the pool's current snapshot; counted, not committed (`commit` it when it is
        taken: `router.profile`)."""
        started_s = time.perf_counter()
        if views is None:
            views = pool.views_for(routing)
        decision = pool.policy.decide(routing, views, commit=False)
        if decision is not None and routing.pinned:
            decision = replace(decision, branch=Branch.PINNED)
        self._metrics.routing_decision_seconds.observe(time.perf_counter() - started_s)
        if decision is not None:
            self._decisions(decision.policy, decision.branch).inc()
        return decision

    @staticmethod
    def commit(pool: Pool, routing: RoutingRequest, decision: Decision) -> None:
        """Tell the pool's policy its decision was taken (its prefix index records the request there)."""
        pool.policy.commit(routing, decision)
