"""The latency models behind the disaggregated plan: decode step line, prefill queue, batched prefill,
decode pool queue, first token on decode. Each against a closed form or an independent event simulation."""

from __future__ import annotations

import math
import random

import pytest

from capacity.decode_queue import DecodeLatency, decode_latency
from capacity.decode_step import DecodeStepModel, fit_decode_step
from capacity.disagg_latency import first_token_s
from capacity.errors import InfeasibleError
from capacity.inputs import ThroughputPoint, ThroughputTable
from capacity.prefill_batching import batched_prefill
from capacity.prefill_queue import prefill_wait, wait_tail_ratio

T_W = 0.0076
STEP = DecodeStepModel(fixed_s=T_W, kv_token_s=1.4e-7, max_batch=128)


def _table(*rows: tuple[int, float], context: int | None = 800) -> ThroughputTable:
    points = tuple(ThroughputPoint(b, v, b * v) for b, v in rows)
    return ThroughputTable(points, ttft_mean_s=0.1, context_tokens=context)


def test_step_line_through_the_rows() -> None:
    exact = [(b, 1 / (0.008 + b * 800 * 2e-7)) for b in (8, 32, 96)]
    with_bandwidth = fit_decode_step(_table(*exact), 26e9, 26e9 / 0.008, 1000)
    assert (with_bandwidth.fixed_s, with_bandwidth.kv_token_s) == (pytest.approx(0.008), pytest.approx(2e-7))
    free = fit_decode_step(_table(*exact), 26e9, None, 1000)
    assert (free.fixed_s, free.kv_token_s, free.max_batch) == (pytest.approx(0.008), pytest.approx(2e-7), 96)
    assert free.step_s(10, 8000) == pytest.approx(0.008 + 10 * 8000 * 2e-7)
    assert free.largest_batch_within(0.024, 8000) == 10
    assert free.largest_batch_within(0.007, 8000) == 0
    unknown_context = fit_decode_step(_table(*exact, context=None), 26e9, None, 1600)
    assert unknown_context.kv_token_s == pytest.approx(1e-7)  # the rows are taken at the workload's 1,600


def test_step_line_refuses_rows_it_cannot_split() -> None:
    with pytest.raises(InfeasibleError) as caught:
        fit_decode_step(_table((64, 68.0)), 26e9, None, 800)
    assert caught.value.key == "throughput.points"
    with pytest.raises(InfeasibleError):
        fit_decode_step(_table((16, 50.0), (64, 68.0)), 26e9, None, 800)  # faster at a larger batch


def test_one_prefill_replica_waits_as_m_d_1() -> None:
    """c = 1: the model's mean is Pollaczek–Khinchine's ρ S / (2 (1 − ρ)) exactly."""
    for rho in (0.2, 0.5, 0.8):
        wait = prefill_wait(1, rho / 0.5, 0.5)
        assert wait.waiting_ratio == pytest.approx(rho)
        assert wait.mean_s == pytest.approx(rho * 0.5 / (2 * (1 - rho)))


def test_prefill_p95_is_the_tails_5_percent_point() -> None:
    for servers, rate in ((1, 1.4), (2, 2.0), (3, 4.0), (6, 8.0)):
        wait = prefill_wait(servers, rate, 0.52)
        assert wait.p95_s > 0
        assert wait_tail_ratio(servers, rate, 0.52, wait.p95_s) == pytest.approx(0.05)
    assert prefill_wait(8, 2.0, 0.5).p95_s == 0.0  # fewer than 5 % wait at all
    assert math.isinf(prefill_wait(2, 4.0, 0.5).mean_s)  # ρ = 1
    assert prefill_wait(4, 4.0, 0.5).p95_s < prefill_wait(3, 4.0, 0.5).p95_s


def _least_load_waits(servers: int, rate: float, service_s: float, n: int) -> list[float]:
    """Event simulation: Poisson arrivals, each to the replica with the fewest in flight, FIFO there."""
    rng = random.Random(7)
    ends: list[list[float]] = [[] for _ in range(servers)]
    now, waits = 0.0, []
    for _ in range(n):
        now += rng.expovariate(rate)
        for queue in ends:
            while queue and queue[0] <= now:
                queue.pop(0)
        chosen = min(range(servers), key=lambda i: len(ends[i]))
        start = max(now, ends[chosen][-1] if ends[chosen] else now)
        ends[chosen].append(start + service_s)
        waits.append(start - now)
    return sorted(waits[n // 10 :])


@pytest.mark.parametrize(("servers", "utilisation"), [(1, 0.7), (2, 0.5), (3, 0.7), (4, 0.7)])
def test_prefill_wait_against_least_load_routing(servers: int, utilisation: float) -> None:
    waits = _least_load_waits(servers, utilisation * servers, 1.0, 150_000)
    model = prefill_wait(servers, utilisation * servers, 1.0)
    assert model.p95_s == pytest.approx(waits[int(0.95 * len(waits))], rel=0.10)
    assert model.mean_s == pytest.approx(sum(waits) / len(waits), rel=0.15)


def _batch_server_latencies(rate: float, fixed_s: float, prompt_s: float, n: int) -> list[float]:
    """Event simulation: each step takes every prompt that has arrived; t_w + k s for k prompts."""
    rng = random.Random(3)
    arrivals, now = [], 0.0
    for _ in range(n):
        now += rng.expovariate(rate)
        arrivals.append(now)
    latencies, i, clock = [], 0, 0.0
    while i < n:
        start = max(clock, arrivals[i])
        j = i
        while j < n and arrivals[j] <= start:
            j += 1
        clock = start + fixed_s + (j - i) * prompt_s
        latencies.extend(clock - arrivals[k] for k in range(i, j))
        i = j
    return sorted(latencies[n // 10 :])


@pytest.mark.parametrize("rate", [8.0, 24.0, 45.0])
def test_batched_prefill_is_exact_for_one_replica(rate: float) -> None:
    simulated = _batch_server_latencies(rate, T_W, 0.016, 80_000)
    model = batched_prefill(1, rate, T_W, 0.016)
    assert model is not None
    assert model.mean_s == pytest.approx(sum(simulated) / len(simulated), rel=0.02)
    assert model.p95_s == pytest.approx(simulated[int(0.95 * len(simulated))], rel=0.03)


def test_batched_prefill_limits() -> None:
    light = batched_prefill(1, 0.01, T_W, 0.016)
    assert light is not None and light.p95_s == pytest.approx(T_W + 0.016, rel=1e-3)
    assert batched_prefill(1, 62.5, T_W, 0.016) is None  # λ · s = 1
    two = batched_prefill(2, 62.5, T_W, 0.016)
    assert two is not None and two.utilisation_ratio == pytest.approx(0.5)


def _latency(rate: float, replicas: int = 1, kv_limit: int = 1000) -> DecodeLatency:
    latency = decode_latency(
        STEP, rate, input_tokens=8000, output_tokens=256, replicas=replicas, kv_limit_streams=kv_limit
    )
    assert latency is not None
    return latency


def test_decode_pool_at_light_load_runs_one_stream_steps() -> None:
    light = _latency(0.001)
    assert light.tpot_mean_s == pytest.approx(STEP.step_s(1, 8128), rel=1e-3)
    assert light.idle_ratio == pytest.approx(1, abs=0.01)


def test_decode_pool_slows_with_load_and_speeds_up_with_replicas() -> None:
    one, busier = _latency(1.0), _latency(2.0)
    assert T_W < one.tpot_mean_s < busier.tpot_mean_s <= busier.tpot_p95_s
    assert busier.tpot_p95_s == pytest.approx(STEP.step_s(busier.streams_p95_per_replica, 8128))
    assert _latency(2.0, replicas=2).tpot_mean_s < busier.tpot_mean_s
    assert busier.streams_mean == pytest.approx(2.0 * 256 * busier.tpot_mean_s)  # Little, no KV wait


def test_decode_pool_kv_limit_and_instability() -> None:
    capped = _latency(2.0, kv_limit=14)
    assert capped.kv_wait_s > 0
    assert capped.streams_p95_per_replica > 14 and capped.tpot_p95_s == pytest.approx(STEP.step_s(14, 8128))
    too_much = 1 / (256 * 8128 * STEP.kv_token_s)  # λ · ō · c̄ · t_kv = 1: no batch keeps up
    assert (
        decode_latency(
            STEP, too_much, input_tokens=8000, output_tokens=256, replicas=1, kv_limit_streams=1000
        )
        is None
    )


def test_first_token_on_decode() -> None:
    busy = DecodeLatency(0.02, 0.03, 10, 12, 0.0, 0.0)
    assert first_token_s(busy, 0.001, T_W) == pytest.approx(2.5 * 0.02)  # T_x < d/2: admission step + one
    assert first_token_s(busy, 0.03, T_W) == pytest.approx(0.03 + 2 * 0.02)  # T_x + d/2 + d/2 + d
    idle = DecodeLatency(0.02, 0.03, 0.1, 0.0, 0.0, 1.0)
    assert first_token_s(idle, 0.03, T_W) == pytest.approx(0.03 + T_W)
