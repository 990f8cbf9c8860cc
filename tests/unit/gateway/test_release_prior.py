"""The release forecast's prior: the pool's time per output token is the engines' mean token latency,
held at most at the TPOT objective while the learned cap steers the engines there."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config.settings import parse_settings
from gateway.proxy.release_prior import pool_token_latency_s
from gateway.upstream.registry import Pool
from tests.unit.gateway.in_memory_admission import pool_admission

MODEL = "m"


def two_replica_pool(**pool_fields: Any) -> Pool:
    settings = parse_settings(
        {
            "pools": [
                {
                    "model": MODEL,
                    "replicas": {"static": ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]},
                    "slo": {"tpot_s": 0.05},
                    **pool_fields,
                }
            ]
        }
    )
    _, registry = pool_admission(settings, MODEL)
    return registry.pools[MODEL]


def test_no_window_yet_gives_no_prior() -> None:
    assert pool_token_latency_s(two_replica_pool()) is None


def test_the_mean_of_the_windows_below_the_objective() -> None:
    pool = two_replica_pool()
    for replica, latency_s in zip(pool.replicas.values(), (0.02, 0.04), strict=True):
        replica.cost.token_latency_s = latency_s
    assert pool_token_latency_s(pool) == pytest.approx(0.03)


def test_cold_prefill_windows_over_the_objective_count_as_the_objective_while_the_cap_is_on() -> None:
    pool = two_replica_pool()
    for replica in pool.replicas.values():
        replica.cost.token_latency_s = 0.25  # five times the objective: every step carries prefill
    assert pool_token_latency_s(pool) == pytest.approx(0.05)


def test_without_the_learned_cap_the_windows_are_taken_whole() -> None:
    pool = two_replica_pool(latency_model={"adaptive_cap": False})
    for replica in pool.replicas.values():
        replica.cost.token_latency_s = 0.25
    assert pool_token_latency_s(pool) == pytest.approx(0.25)
