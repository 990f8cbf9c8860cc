"""Gateway membership, the pure parts: k → traffic share 1/k, clamping, the last known k while Redis is
unreachable, the heartbeat loop's lifecycle (against a fake store), and the autoscalers' share."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import ConfigError, parse_settings
from gateway.fleet.autoscaling import AutoscaleSignals
from gateway.fleet.instance_membership import (
    HEARTBEATS_PER_TTL,
    GatewayMembership,
    InstanceCount,
    new_instance_id,
    traffic_share,
)
from gateway.upstream.registry import ReplicaRegistry


class FakeStore:
    """Answers heartbeats from a script (None = Redis unreachable) and records every call."""

    def __init__(self, replies: list[int | None] | None = None, default: int | None = 1) -> None:
        self.replies = list(replies or [])
        self.default = default
        self.heartbeats: list[tuple[str, float]] = []
        self.left: list[str] = []
        self.fail_with: Exception | None = None

    async def heartbeat(self, instance_id: str, ttl_s: float) -> int | None:
        self.heartbeats.append((instance_id, ttl_s))
        if self.fail_with is not None:
            raise self.fail_with
        return self.replies.pop(0) if self.replies else self.default

    async def leave(self, instance_id: str) -> int | None:
        self.left.append(instance_id)
        return 0


class TestTrafficShare:
    @pytest.mark.parametrize(
        ("configured", "measured", "share"),
        [(None, 1, 1.0), (None, 2, 0.5), (None, 4, 0.25), (3, 1, 1 / 3), (2, 5, 0.5), (1, 8, 1.0)],
    )
    def test_one_over_k_the_configured_count_wins(
        self, configured: int | None, measured: int, share: float
    ) -> None:
        assert traffic_share(configured, measured) == pytest.approx(share)

    @pytest.mark.parametrize("measured", [0, -3])
    def test_k_below_one_counts_as_one(self, measured: int) -> None:
        assert traffic_share(None, measured) == 1.0


class TestInstanceCount:
    def test_starts_at_one_instance(self) -> None:
        count = InstanceCount(FakeClock())
        assert (count.k, count.share, count.failures, count.age_s()) == (1, 1.0, 0, None)

    def test_a_measurement_sets_k_and_reports_changes(self) -> None:
        clock = FakeClock(100.0)
        count = InstanceCount(clock)
        assert count.observe(3)
        assert (count.k, count.share) == (3, pytest.approx(1 / 3))
        assert not count.observe(3)
        clock.advance(4.0)
        assert count.age_s() == 4.0
        assert count.observe(2)
        assert (count.k, count.age_s()) == (2, 0.0)

    def test_k_is_clamped_to_at_least_one(self) -> None:
        count = InstanceCount(FakeClock())
        count.observe(2)
        assert count.observe(0)
        assert (count.k, count.share) == (1, 1.0)

    def test_unreachable_keeps_the_last_known_k(self) -> None:
        clock = FakeClock()
        count = InstanceCount(clock)
        count.observe(3)
        clock.advance(10.0)
        assert not count.observe(None)
        assert not count.observe(None)
        assert (count.k, count.failures, count.age_s()) == (3, 2, 10.0)
        assert count.observe(4)  # recovers by itself at the next answer
        assert (count.k, count.failures, count.age_s()) == (4, 0, 0.0)

    def test_unreachable_before_any_measurement_means_one(self) -> None:
        count = InstanceCount(FakeClock())
        assert not count.observe(None)
        assert (count.k, count.age_s()) == (1, None)


def test_instance_ids_are_random_per_process() -> None:
    ids = {new_instance_id() for _ in range(100)}
    assert len(ids) == 100


class TestGatewayMembership:
    def _membership(self, store: FakeStore, **kwargs: Any) -> tuple[GatewayMembership, list[int]]:
        counts: list[int] = []
        kwargs.setdefault("ttl_s", 9.0)
        membership = GatewayMembership(store, clock=FakeClock(), on_count=counts.append, **kwargs)
        return membership, counts

    async def test_on_count_runs_when_k_changes_only(self) -> None:
        store = FakeStore([1, 2, 2, 3])
        membership, counts = self._membership(store)
        assert [await membership.heartbeat() for _ in range(4)] == [1, 2, 2, 3]
        assert counts == [2, 3]
        assert store.heartbeats == [(membership.instance_id, 9.0)] * 4
        assert membership.period_s == 9.0 / HEARTBEATS_PER_TTL

    async def test_unreachable_keeps_k_and_warns_once_per_outage(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        store = FakeStore([3, None, None, None, 3, None])
        membership, counts = self._membership(store)
        with caplog.at_level(logging.WARNING, logger="gateway.fleet.instance_membership"):
            assert [await membership.heartbeat() for _ in range(6)] == [3] * 6
        assert counts == [3]
        warnings = [r.getMessage() for r in caplog.records if "keeping 3 gateway instance" in r.getMessage()]
        assert len(warnings) == 2  # one per outage, not one per failed heartbeat

    async def test_leave_removes_the_member_and_stops_heartbeats(self) -> None:
        store = FakeStore([2])
        membership, _ = self._membership(store)
        await membership.heartbeat()
        await membership.leave()
        await membership.leave()  # idempotent
        assert store.left == [membership.instance_id]
        assert await membership.heartbeat() == 2  # a no-op once left
        assert len(store.heartbeats) == 1
        membership.start()  # never starts again once left
        await asyncio.sleep(0)
        assert len(store.heartbeats) == 1

    async def test_the_loop_beats_every_period_until_it_leaves(self) -> None:
        store = FakeStore(default=2)
        membership, counts = self._membership(store, ttl_s=0.03)  # a heartbeat every 10 ms
        membership.start()
        for _ in range(200):
            if len(store.heartbeats) >= 3:
                break
            await asyncio.sleep(0.005)
        await membership.leave()
        beats = len(store.heartbeats)
        assert beats >= 3 and counts == [2]
        await asyncio.sleep(0.05)
        assert len(store.heartbeats) == beats  # no heartbeat after leaving
        assert store.left == [membership.instance_id]

    async def test_a_failing_heartbeat_is_counted_and_retried(self) -> None:
        store = FakeStore(default=2)
        store.fail_with = RuntimeError("script bug")
        errors: list[None] = []
        membership, counts = self._membership(store, ttl_s=0.03, on_error=lambda: errors.append(None))
        membership.start()
        for _ in range(200):
            if len(errors) >= 2:
                break
            await asyncio.sleep(0.005)
        store.fail_with = None
        for _ in range(200):
            if counts:
                break
            await asyncio.sleep(0.005)
        await membership.leave()
        assert len(errors) >= 2 and counts == [2]

    def test_ttl_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="ttl_s"):
            GatewayMembership(FakeStore(), ttl_s=0, clock=FakeClock(), on_count=lambda _: None)


def _signals(pools: list[dict[str, Any]], clock: FakeClock) -> AutoscaleSignals:
    settings = parse_settings({"pools": pools})
    metrics = GatewayMetrics()
    registry = ReplicaRegistry(settings, metrics, clock, random.Random(0))
    return AutoscaleSignals(registry, metrics, clock, lambda _: 0)


def _pool(model: str, **autoscale: Any) -> dict[str, Any]:
    return {
        "model": model,
        "replicas": {"static": ["http://127.0.0.1:1"]},
        "max_concurrency_per_replica": 8,
        "autoscale": {"decode_tokens_per_s": 1000, **autoscale},
    }


class TestAutoscaleSignalsShare:
    def test_measured_k_sets_the_share_of_pools_without_a_configured_count(self) -> None:
        signals = _signals([_pool("measured"), _pool("fixed", gateway_instances=2)], FakeClock())
        scalers = signals.scalers
        assert signals.measures_gateway_instances
        assert scalers["measured"].traffic_share_ratio == 1.0  # memory state / before a measurement
        assert scalers["fixed"].traffic_share_ratio == 0.5
        signals.set_gateway_instances(4)
        assert scalers["measured"].traffic_share_ratio == 0.25
        assert scalers["fixed"].traffic_share_ratio == 0.5
        signals.set_gateway_instances(0)
        assert scalers["measured"].traffic_share_ratio == 1.0

    def test_every_pool_configured_needs_no_measurement(self) -> None:
        signals = _signals([_pool("a", gateway_instances=3)], FakeClock())
        assert not signals.measures_gateway_instances
        assert signals.scalers["a"].traffic_share_ratio == pytest.approx(1 / 3)

    def test_the_gauge_reports_one_over_k(self) -> None:
        clock = FakeClock()
        signals = _signals([_pool("m", evaluation_period_s=5)], clock)
        signals.set_gateway_instances(3)
        clock.advance(5.0)
        signals.sample_and_export()
        registry = signals._metrics.registry
        value = registry.get_sample_value("llm_gateway_autoscale_traffic_share_ratio", {"pool": "m"})
        assert value == pytest.approx(1 / 3)

    def test_gateway_instances_must_be_at_least_one(self) -> None:
        with pytest.raises(ConfigError, match="gateway_instances"):
            parse_settings({"pools": [_pool("m", gateway_instances=0)]})
