"""The continuous-batching core on a fake clock: timing, batching limits, preemption, abort, time API."""

from __future__ import annotations

import itertools
import random

import pytest

from mock_engine.core import EngineCore
from mock_engine.physics import PhysicsCore, RequestTooLargeError, load_profile
from tests.unit.mock_engine.harness import assert_complete, by_request, request, run_until_idle, tiny

# tiny: weights read 1 ms per step, KV read 2.048e-7 s per context token, prefill 1e-5 s per token.
WEIGHTS_S = 0.001
KV_S_PER_TOKEN = 1024 / (10e9 * 0.5)
PREFILL_S_PER_TOKEN = 1 / 100_000


def test_single_request_follows_the_step_formula() -> None:
    core = PhysicsCore(tiny())
    core.submit(request("a", prompt_tokens=100, max_tokens=3, arrival_s=1.0))
    events = run_until_idle(core)
    first_s = 1.0 + WEIGHTS_S + 100 * PREFILL_S_PER_TOKEN
    second_s = first_s + WEIGHTS_S + 101 * KV_S_PER_TOKEN
    third_s = second_s + WEIGHTS_S + 102 * KV_S_PER_TOKEN
    assert [e.time_s for e in events] == pytest.approx([first_s, second_s, third_s])
    assert [(e.index, e.finished) for e in events] == [(0, False), (1, False), (2, True)]
    stats = core.stats()
    assert (stats.running, stats.waiting, stats.kv_usage_ratio) == (0, 0, 0.0)
    assert (stats.prompt_tokens_total, stats.generation_tokens_total) == (100, 3)


def test_requests_batch_and_per_stream_speed_falls_with_batch_size() -> None:
    def mean_gap_s(batch: int) -> float:
        core = PhysicsCore(tiny())
        for i in range(batch):
            core.submit(request(f"r{i}", prompt_tokens=200, max_tokens=50))
        times = [e.time_s for e in by_request(run_until_idle(core))["r0"]]
        return (times[-1] - times[1]) / (len(times) - 2)

    assert mean_gap_s(1) < mean_gap_s(4) < mean_gap_s(8)


def test_prefix_cache_hit_cuts_ttft_and_counts_tokens() -> None:
    system = "S" * 4 * 1000  # 1000 tokens: 62 full blocks of 16 tokens
    core = PhysicsCore(tiny())
    core.submit(request("cold", 1010, 2, text=system + "question one"[:40].ljust(40, ".")))
    cold = run_until_idle(core)
    core.submit(request("warm", 1010, 2, arrival_s=1.0, text=system + "question two"[:40].ljust(40, ".")))
    warm = run_until_idle(core)
    cold_ttft_s = cold[0].time_s - 0.0
    warm_ttft_s = warm[0].time_s - 1.0
    assert cold_ttft_s == pytest.approx(WEIGHTS_S + 1010 * PREFILL_S_PER_TOKEN)
    assert warm_ttft_s == pytest.approx(WEIGHTS_S + (1010 - 992) * PREFILL_S_PER_TOKEN)
    assert warm_ttft_s < cold_ttft_s / 5
    stats = core.stats()
    assert (stats.prefix_cache_queries_tokens, stats.prefix_cache_hits_tokens) == (2020, 992)


def test_identical_prompt_recomputes_at_least_its_last_block() -> None:
    text = "P" * 4 * 64  # exactly 4 blocks
    core = PhysicsCore(tiny())
    core.submit(request("a", 64, 1, text=text))
    run_until_idle(core)
    core.submit(request("b", 64, 1, arrival_s=1.0, text=text))
    run_until_idle(core)
    assert core.stats().prefix_cache_hits_tokens == 48


def test_cache_lives_in_free_kv_and_evicts_lru_tail_blocks_first() -> None:
    core = PhysicsCore(tiny())  # 250 blocks
    text_a = "A" * 4 * 3000  # 187 full blocks + a partial one
    core.submit(request("a", 3000, 1, text=text_a))
    run_until_idle(core)
    assert core.cached_prefix_blocks == 187
    core.submit(request("b", 3000, 1, arrival_s=1.0, text="B" * 4 * 3000))
    core.next_event_s()  # b admitted: 188 blocks used, 62 free
    assert core.cached_prefix_blocks <= 250 - 188
    run_until_idle(core)
    core.submit(request("a2", 3000, 1, arrival_s=2.0, text=text_a))
    run_until_idle(core)
    assert core.stats().prefix_cache_hits_tokens == 62 * 16  # a's head blocks survived, its tail went


def test_full_kv_makes_requests_wait_fifo() -> None:
    core = PhysicsCore(tiny())  # 250 blocks; each 1500-token prompt takes 94
    for name in ("a", "b", "c", "d"):
        core.submit(request(name, prompt_tokens=1500, max_tokens=10))
    events = core.advance(core.next_event_s() or 0.0)
    stats = core.stats()
    assert (stats.running, stats.waiting) == (2, 2)
    assert stats.kv_usage_ratio == pytest.approx(188 / 250)
    events += core.advance(10.0)
    assert_complete(events, {name: 10 for name in "abcd"})
    grouped = by_request(events)
    assert grouped["c"][0].time_s > grouped["a"][-1].time_s
    assert grouped["c"][0].time_s <= grouped["d"][0].time_s


def test_max_num_seqs_bounds_the_running_batch() -> None:
    core = PhysicsCore(tiny())
    for i in range(10):
        core.submit(request(f"r{i}", prompt_tokens=10, max_tokens=5))
    core.next_event_s()
    assert (core.stats().running, core.stats().waiting) == (8, 2)
    assert_complete(run_until_idle(core), {f"r{i}": 5 for i in range(10)})


def test_kv_pressure_preempts_the_youngest_and_recomputes_it() -> None:
    core = PhysicsCore(tiny())  # 2 × 1800-token prompts fit (226 blocks), 2 × 2400 contexts do not
    core.submit(request("old", prompt_tokens=1800, max_tokens=600))
    core.submit(request("young", prompt_tokens=1800, max_tokens=600))
    events = run_until_idle(core)
    assert_complete(events, {"old": 600, "young": 600})
    assert core.stats().preemptions_total == 1
    old, young = by_request(events)["old"], by_request(events)["young"]
    gaps_s = [b.time_s - a.time_s for a, b in itertools.pairwise(old)]
    assert max(gaps_s) < 0.01  # the old sequence never stalls
    resumed = next(b for a, b in itertools.pairwise(young) if b.time_s - a.time_s > 0.01)
    assert resumed.time_s > old[-1].time_s  # the young one resumes after the old one frees its KV
    assert core.stats().prefix_cache_hits_tokens > 0  # its recompute reuses its cached prompt blocks


def test_abort_frees_kv_and_lets_the_waiting_request_in() -> None:
    core = PhysicsCore(tiny())
    core.submit(request("big", prompt_tokens=3000, max_tokens=900))
    core.submit(request("next", prompt_tokens=3000, max_tokens=5))
    core.advance(0.5)
    assert core.stats().kv_usage_ratio > 0.7
    assert core.stats().waiting == 1
    core.abort("big")
    assert (core.stats().running, core.stats().kv_usage_ratio) == (0, 0.0)
    events = run_until_idle(core)
    assert {e.request_id for e in events} == {"next"}
    core.abort("big")  # unknown/finished ids are ignored
    core.abort("never-submitted")


def test_abort_of_a_waiting_request_and_mid_step() -> None:
    core = PhysicsCore(tiny(max_num_seqs=1))
    core.submit(request("a", prompt_tokens=10, max_tokens=3))
    core.submit(request("b", prompt_tokens=10, max_tokens=3))
    core.next_event_s()  # a's prefill step is in flight
    core.abort("b")
    assert core.stats().waiting == 0
    core.abort("a")
    assert run_until_idle(core) == []
    assert core.next_event_s() is None


def test_long_prefill_delays_everyones_decode_unless_chunked() -> None:
    def worst_gap_s(chunk_tokens: int | None) -> float:
        core = PhysicsCore(tiny(chunk_tokens_per_step=chunk_tokens))
        core.submit(request("stream", prompt_tokens=10, max_tokens=200))
        core.submit(request("long", prompt_tokens=3000, max_tokens=1, arrival_s=0.05))
        stream = by_request(run_until_idle(core))["stream"]
        return max(b.time_s - a.time_s for a, b in itertools.pairwise(stream))

    assert worst_gap_s(None) == pytest.approx(WEIGHTS_S + 3000 * PREFILL_S_PER_TOKEN, rel=0.01)
    assert worst_gap_s(256) < WEIGHTS_S + 256 * PREFILL_S_PER_TOKEN + 0.0001


def test_next_event_s_is_consistent_with_advance() -> None:
    core = PhysicsCore(tiny())
    assert core.next_event_s() is None
    core.submit(request("a", prompt_tokens=100, max_tokens=4, arrival_s=2.0))
    next_s = core.next_event_s()
    assert next_s is not None and next_s > 2.0
    assert core.next_event_s() == next_s  # asking twice changes nothing
    assert core.advance(next_s - 1e-9) == []
    events = core.advance(next_s)
    assert [e.time_s for e in events] == [next_s]
    assert core.advance(next_s - 1.0) == []  # time never goes back


def _workload() -> list[tuple[str, int, int, float, str]]:
    shared = "shared system prompt " * 40
    return [
        (f"r{i}", 300 + 37 * (i % 5), 20 + 11 * (i % 7), 0.003 * i, shared + f"user {i} " * (i % 4) * 10)
        for i in range(40)
    ]


def _run(step_s: float | None) -> tuple[list[object], object]:
    core = PhysicsCore(tiny())
    for request_id, prompt_tokens, max_tokens, arrival_s, text in _workload():
        core.submit(request(request_id, prompt_tokens, max_tokens, arrival_s, text.ljust(4 * prompt_tokens)))
    if step_s is None:
        return list(run_until_idle(core)), core.stats()
    events: list[object] = []
    now_s = 0.0
    while core.next_event_s() is not None:
        now_s += step_s
        events.extend(core.advance(now_s))
    return events, core.stats()


def test_event_jumping_and_a_fine_clock_grid_give_the_same_history() -> None:
    assert _run(None) == _run(0.0007)


def test_runs_are_deterministic() -> None:
    first_events, first_stats = _run(None)
    assert (first_events, first_stats) == _run(None)
    assert len(first_events) == sum(w[2] for w in _workload())


def test_submit_validation() -> None:
    core = PhysicsCore(tiny())
    core.submit(request("a", 10, 5))
    with pytest.raises(ValueError, match="duplicate"):
        core.submit(request("a", 10, 5))
    with pytest.raises(ValueError, match="max_tokens"):
        core.submit(request("b", 10, 0))
    with pytest.raises(RequestTooLargeError):
        core.submit(request("c", 3990, 100))
    core.submit(request("empty", 0, 2, text=""))
    assert_complete(run_until_idle(core), {"a": 5, "empty": 2})


def test_hundreds_of_streams_on_the_default_profile() -> None:
    core = PhysicsCore(load_profile("h100-13b-fp16"))
    for i in range(400):
        core.submit(request(f"r{i}", prompt_tokens=800, max_tokens=100, arrival_s=i * 0.01))
    events = run_until_idle(core)
    assert_complete(events, {f"r{i}": 100 for i in range(400)})
    assert core.stats().kv_usage_ratio == 0.0


@pytest.mark.parametrize("seed", range(12))
def test_random_workloads_with_aborts_complete_and_free_all_kv(seed: int) -> None:
    rng = random.Random(seed)
    core: EngineCore = PhysicsCore(
        tiny(chunk_tokens_per_step=rng.choice([None, 64, 300]), max_num_seqs=rng.choice([2, 8, 32]))
    )
    prefixes = ["".join(rng.choice("ab") for _ in range(64)) * rng.randint(1, 20) for _ in range(3)]
    now_s, expected, aborted, events = 0.0, {}, set(), []
    for i in range(40):
        now_s += rng.expovariate(200)
        events += core.advance(now_s)
        assert 0.0 <= core.stats().kv_usage_ratio <= 1.0
        prompt_tokens, max_tokens = rng.randint(0, 1500), rng.randint(1, 400)
        text = (rng.choice(prefixes) + f"request {i}")[: 4 * prompt_tokens]
        core.submit(request(f"r{i}", prompt_tokens, max_tokens, now_s, text))
        expected[f"r{i}"] = max_tokens
        if rng.random() < 0.15:
            victim = rng.choice(sorted(expected))
            core.abort(victim)
            aborted.add(victim)
            events = [e for e in events if e.request_id != victim]
    while (next_s := core.next_event_s()) is not None:
        events += core.advance(next_s)
    assert_complete(events, {k: v for k, v in expected.items() if k not in aborted})
    stats = core.stats()
    assert (stats.running, stats.waiting, stats.kv_usage_ratio) == (0, 0, 0.0)


def test_inter_token_latency_sums_every_gap_after_each_first_token() -> None:
    core = PhysicsCore(tiny())
    core.submit(request("a", prompt_tokens=100, max_tokens=4))
    core.submit(request("b", prompt_tokens=60, max_tokens=3))
    events = by_request(run_until_idle(core))
    gaps = [
        later.time_s - earlier.time_s for seq in events.values() for earlier, later in itertools.pairwise(seq)
    ]
    stats = core.stats()
    assert stats.inter_token_latency_count == len(gaps) == 3 + 2
    assert stats.inter_token_latency_sum_s == pytest.approx(sum(gaps))
