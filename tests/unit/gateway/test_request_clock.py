"""Request timing reads the app's injected clock (`core.clock`): the reply's elapsed time and first
output, an attempt's deadlines, a slot's first token and TPOT."""

from __future__ import annotations

import random
from typing import Any, cast

from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.proxy.attempt import Attempt
from gateway.proxy.reply import Reply
from gateway.upstream.registry import ReplicaRegistry
from router.types import Branch, Decision


def test_the_reply_times_the_request_on_the_injected_clock() -> None:
    clock = FakeClock(100.0)
    reply = Reply(request_id="r", send=cast(Any, None), clock=clock)
    assert reply.started_s == 100.0
    clock.advance(0.25)
    reply.mark_first_output()
    clock.advance(1.0)
    assert (reply.first_output_s, reply.elapsed_s()) == (0.25, 1.25)


def test_an_attempt_and_its_slot_time_on_the_injected_clock() -> None:
    clock = FakeClock(50.0)
    settings = parse_settings(
        {"pools": [{"model": "m", "replicas": {"static": ["http://10.0.0.1:8000"]}, "latency_model": {}}]}
    )
    registry = ReplicaRegistry(settings, GatewayMetrics(), clock, random.Random(0))
    (replica,) = registry.pools["m"].replicas.values()
    decision = Decision(replica_id=replica.replica_id, policy="p", branch=Branch.LEAST_LOAD)
    slot = registry.claim(replica, decision, 10, uncached_tokens=10)
    attempt = Attempt(slot, 1, clock)
    leg = Attempt(slot, 1, clock, started_s=49.0)  # a decode leg's deadlines run from its prefill's start
    clock.advance(0.5)
    assert (attempt.elapsed_s(), leg.elapsed_s()) == (0.5, 1.5)
    slot.first_token()
    model = replica.cost.model
    assert model is not None and model.ttft.samples == 1, "the TTFT the slot measured on the clock"
    slot.release()
