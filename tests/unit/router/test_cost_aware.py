"""Cost-aware routing: token-aware load, sticky-until-saturated prefix affinity, the SLO-aware pick."""

from __future__ import annotations

from typing import Any

import pytest

from router.keys import build_routing_request
from router.latency_model import LatencyEstimate
from router.load import queued_prefill_tokens, running_sequences
from router.types import Branch, EngineLoad, RoutingRequest
from tests.unit.router.snapshots import IDS, decided, fleet, policy, ring_order

BLOCK = 64  # characters per block: 16 tokens


def shared(prefix_chars: int, question: str, **fields: object) -> RoutingRequest:
    """A request whose first `prefix_chars` are a fixed shared prefix (one block hash per 64 chars)."""
    text = "s" * prefix_chars + question
    request = build_routing_request("m", text)
    return RoutingRequest(
        model="m",
        prompt_text=text,
        estimated_prompt_tokens=request.estimated_prompt_tokens,
        prefix_hashes=request.prefix_hashes,
        prefix_key=request.prefix_key,
        **fields,  # type: ignore[arg-type]
    )


def test_uncached_tokens_subtracts_the_matched_blocks() -> None:
    request = RoutingRequest(model="m", estimated_prompt_tokens=1000)
    assert request.uncached_tokens(None) == 1000
    assert request.uncached_tokens(0) == 1000
    assert request.uncached_tokens(10) == 1000 - 10 * 16
    assert request.uncached_tokens(1000) == 0


def test_token_aware_load_reads_own_counts_and_fresh_engine_running() -> None:
    (view,) = fleet(("r0",), r0={"prefill_tokens_inflight": 500, "decoding_requests": 3})
    request = RoutingRequest(model="m", estimated_prompt_tokens=200)
    assert queued_prefill_tokens(view, request, None) == 700
    assert running_sequences(view) == 3
    (busy,) = fleet(("r0",), r0={"decoding_requests": 3, "engine": EngineLoad(running=9)})
    assert running_sequences(busy) == 9
    (stale,) = fleet(("r0",), r0={"decoding_requests": 3, "engine": EngineLoad(running=9, stale=True)})
    assert running_sequences(stale) == 3


def test_sticky_prefix_holds_the_warm_replica_until_its_prefill_queue_passes_tau() -> None:
    sticky = policy("sticky-prefix", prefill_budget_tokens=4000)
    request = shared(8192, "q1")  # 2,049 tokens, 128 blocks
    replicas = fleet()
    first = decided(sticky.decide(request, replicas))
    warm = first.replica_id
    assert first.branch is Branch.PREFIX_MISS and warm == ring_order(request.prefix_key or 0)[0]
    # The warm replica holds the prefix: only the question is uncached, so it stays while its queue is small.
    loaded = fleet(**{warm: {"prefill_tokens_inflight": 3000}})
    again = decided(sticky.decide(shared(8192, "q2"), loaded))
    assert (again.replica_id, again.branch) == (warm, Branch.STICKY)
    # Past τ it spills to the next replica on the ring, never to an arbitrary least-loaded one.
    saturated = fleet(**{warm: {"prefill_tokens_inflight": 4000}})  # + its own 1 uncached token
    spilled = decided(sticky.decide(shared(8192, "q3"), saturated))
    order = [r for r in ring_order(request.prefix_key or 0) if r != warm]
    assert (spilled.replica_id, spilled.branch, spilled.detail.get("hops", 0)) == (
        order[0],
        Branch.SPILLOVER,
        1,
    )


def test_sticky_prefix_spills_past_the_count_bound_unless_it_is_off() -> None:
    """In-flight 10 on the warm replica, 0 elsewhere: bound = ceil(1.5 × 11 / 4) = 5, so it spills; with
    load_factor null only τ counts and it stays."""
    request = shared(8192, "q")
    owner = ring_order(request.prefix_key or 0)[0]
    busy = fleet(**{owner: {"inflight_requests": 10}})
    spilled = decided(policy("sticky-prefix").decide(request, busy))
    assert spilled.replica_id != owner and spilled.branch is Branch.SPILLOVER
    stays = decided(policy("sticky-prefix", load_factor=None).decide(request, busy))
    assert stays.replica_id == owner


def test_sticky_prefix_all_over_tau_takes_the_least_queued() -> None:
    sticky = policy("sticky-prefix", prefill_budget_tokens=100)
    loads = {rid: {"prefill_tokens_inflight": 1000 + i * 10} for i, rid in enumerate(IDS)}
    loads["r2"] = {"prefill_tokens_inflight": 5}
    decision = decided(sticky.decide(shared(4096, "q"), fleet(**loads)))
    assert (decision.replica_id, decision.branch) == ("r2", Branch.ALL_OVER_BOUND)


def test_sticky_prefix_tau_from_rate_or_the_learned_model() -> None:
    """τ = rate × penalty: 16,000 tok/s × 0.25 s = 4,000 tokens; from the model, 1000 / (a1 + a4) tok/s."""
    request = shared(8192, "q")
    owner = ring_order(request.prefix_key or 0)[0]
    options = {"prefill_tokens_per_s": 16_000, "ttft_penalty_s": 0.25}
    under = fleet(**{owner: {"prefill_tokens_inflight": 4000 - request.estimated_prompt_tokens}})
    assert decided(policy("sticky-prefix", **options).decide(request, under)).replica_id == owner
    over = fleet(**{owner: {"prefill_tokens_inflight": 4001 - request.estimated_prompt_tokens}})
    assert decided(policy("sticky-prefix", **options).decide(request, over)).replica_id != owner
    # a1 + a4 = 0.125 s per 1,000 own tokens: 8,000 tok/s (a1 alone would give 16,000, τ = 8,000)
    learned = LatencyEstimate(ttft=(0.02, 0.0625, 0.0, 0.0, 0.0625, 0.0))
    by_model = policy("sticky-prefix", ttft_penalty_s=0.5)  # τ = 4,000
    fields = {"latency": learned, "prefill_tokens_inflight": 4001 - request.estimated_prompt_tokens}
    assert decided(by_model.decide(request, fleet(**{owner: fields}))).replica_id != owner


def test_requests_without_prefix_blocks_go_to_the_least_queued() -> None:
    sticky = policy("sticky-prefix")
    loads = {rid: {"prefill_tokens_inflight": 100} for rid in IDS}
    loads["r3"] = {"prefill_tokens_inflight": 0}
    decision = decided(sticky.decide(RoutingRequest(model="m", estimated_prompt_tokens=5), fleet(**loads)))
    assert (decision.replica_id, decision.branch) == ("r3", Branch.NO_KEY)


# TTFT = 20 ms + 62.5 ms per 1,000 queued tokens (16,000 tok/s); TPOT = 10 ms + 4 ms per 10 running.
MODEL = LatencyEstimate(ttft=(0.02, 0.0625, 0.0, 0.0, 0.0, 0.0), tpot=(0.01, 0.004, 0.0))


def test_predicted_latency_is_cold_until_a_model_is_warm_then_cold_replicas_borrow_the_mean() -> None:
    chooser = policy("predicted-latency")
    cold = decided(chooser.decide(shared(4096, "q"), fleet()))
    assert cold.branch is Branch.COLD_MODEL and cold.detail.get("predicted_ttft_s") is None
    # r0 is warm and busy; the others are cold and predicted with r0's coefficients: an idle one wins.
    replicas = fleet(r0={"latency": MODEL, "prefill_tokens_inflight": 50_000})
    request = RoutingRequest(model="m", estimated_prompt_tokens=1000)
    decision = decided(policy("predicted-latency").decide(request, replicas))
    assert decision.replica_id != "r0" and decision.branch is Branch.SLO_MET
    assert decision.detail.get("predicted_ttft_s") == pytest.approx(0.02 + 0.0625)


def test_predicted_latency_takes_the_lowest_predicted_ttft_with_the_prefix_benefit() -> None:
    chooser = policy("predicted-latency")
    warm_up = shared(16_384, "first")
    first = decided(chooser.decide(warm_up, fleet(**{rid: {"latency": MODEL} for rid in IDS})))
    warm = first.replica_id
    # The warm replica has 2,000 tokens queued; a cold one none, but it must prefill the 4,097-token prompt.
    loads = {rid: {"latency": MODEL} for rid in IDS}
    loads[warm] = {"latency": MODEL, "prefill_tokens_inflight": 2000}
    request = shared(16_384, "second", slo_ttft_s=2.0, slo_tpot_s=0.05)
    decision = decided(chooser.decide(request, fleet(**loads)))
    assert decision.replica_id == warm and decision.branch is Branch.SLO_MET
    uncached = request.uncached_tokens(decision.detail.get("matched_prefix_blocks"))
    assert decision.detail.get("predicted_ttft_s") == pytest.approx(0.02 + 0.0625 * (2000 + uncached) / 1000)
    assert "predicted_ttft_ms=" in decision.header_value()
    # With 40,000 tokens queued there, a cold replica is predicted faster: it moves.
    loads[warm] = {"latency": MODEL, "prefill_tokens_inflight": 40_000}
    moved = decided(chooser.decide(shared(16_384, "third"), fleet(**loads)))
    assert moved.replica_id != warm


def test_predicted_latency_prices_the_request_own_prefill_apart_from_the_tokens_ahead() -> None:
    """a4 prices the request's own uncached tokens on top of a1: with 3,000 tokens ahead on the warm
    replica (3,000 × a1 = 90 ms) against the prompt's 4,000-odd uncached tokens on a cold one
    (× (a1 + a4) = 360 ms), the warm replica wins, and the prediction carries both terms."""
    split = LatencyEstimate(ttft=(0.02, 0.03, 0.0, 0.0, 0.06, 0.0), tpot=(0.01, 0.004, 0.0))
    chooser = policy("predicted-latency")
    loads = {rid: {"latency": split} for rid in IDS}
    first = decided(chooser.decide(shared(16_384, "first"), fleet(**loads)))
    loads[first.replica_id] = {"latency": split, "prefill_tokens_inflight": 3000}
    request = shared(16_384, "second")
    decision = decided(chooser.decide(request, fleet(**loads)))
    own = request.uncached_tokens(decision.detail.get("matched_prefix_blocks"))
    assert decision.replica_id == first.replica_id and own < 100
    assert decision.detail.get("predicted_ttft_s") == pytest.approx(
        0.02 + 0.03 * (3000 + own) / 1000 + 0.06 * own / 1000
    )


def test_predicted_latency_reads_the_phase_of_the_step_in_flight() -> None:
    """a5 = −20 ms per 0.1 s since the replica's last token (the step in flight began that long ago,
    less of it is left): of identical replicas the one 40 ms into its step wins, predicted 8 ms less."""
    phased = LatencyEstimate(ttft=(0.05, 0.0625, 0.0, 0.0, 0.0, -0.02), tpot=(0.01, 0.004, 0.0))
    loads: dict[str, dict[str, Any]] = {rid: {"latency": phased, "decoding_requests": 4} for rid in IDS}
    loads["r2"] = {**loads["r2"], "since_last_token_s": 0.04}
    request = RoutingRequest(model="m", estimated_prompt_tokens=100)
    decision = decided(policy("predicted-latency").decide(request, fleet(**loads)))
    assert decision.replica_id == "r2"
    assert decision.detail.get("predicted_ttft_s") == pytest.approx(0.05 + 0.0625 * 0.1 - 0.008)


def test_predicted_latency_skips_replicas_predicted_to_miss_tpot() -> None:
    chooser = policy("predicted-latency")
    loads = {rid: {"latency": MODEL, "decoding_requests": 200} for rid in IDS}  # TPOT 90 ms
    loads["r1"] = {"latency": MODEL, "decoding_requests": 50, "prefill_tokens_inflight": 30_000}
    request = RoutingRequest(model="m", estimated_prompt_tokens=100, slo_tpot_s=0.05, slo_ttft_s=None)
    decision = decided(chooser.decide(request, fleet(**loads)))
    assert decision.replica_id == "r1"  # slower TTFT, but the only one predicted within TPOT
    assert decision.branch is Branch.SLO_MET and decision.detail.get("predicted_tpot_s") == pytest.approx(
        0.01 + 0.0004 * 51
    )


def test_predicted_latency_keeps_a_replica_holding_the_prefix_even_over_tpot() -> None:
    """The warm replica decodes 200 sequences (TPOT 90 ms, over the 50 ms objective) and holds the
    request's 4,096-token prefix; the others decode 50 (30 ms) but would prefill all of it. The TPOT
    filter spares the holder, so the lower TTFT of the hit wins (branch `slo_prefix_over_tpot`: others
    were predicted within TPOT); a replica over TPOT without the prefix is still skipped (test above)."""
    chooser = policy("predicted-latency")
    loads: dict[str, dict[str, Any]] = {rid: {"latency": MODEL, "decoding_requests": 50} for rid in IDS}
    warm = decided(chooser.decide(shared(16_384, "first"), fleet(**loads))).replica_id
    loads[warm] = {"latency": MODEL, "decoding_requests": 200}
    request = shared(16_384, "second", slo_tpot_s=0.05)
    decision = decided(chooser.decide(request, fleet(**loads)))
    assert decision.replica_id == warm and decision.branch is Branch.SLO_PREFIX_OVER_TPOT
    assert decision.detail.get("predicted_tpot_s") == pytest.approx(0.01 + 0.0004 * 201)


def test_a_prefix_every_candidate_holds_spares_none_from_the_tpot_filter() -> None:
    """A common system prompt held everywhere: going elsewhere loses nothing, so the busy replica
    (TPOT 90 ms, the fastest TTFT: the others have 2,000 prefill tokens queued) is still skipped."""
    chooser = policy("predicted-latency")
    loads: dict[str, dict[str, Any]] = {rid: {"latency": MODEL, "decoding_requests": 50} for rid in IDS}
    for rid in IDS:  # the others excluded, each replica takes one request of the prefix: all hold it
        others = frozenset(IDS) - {rid}
        assert decided(chooser.decide(shared(16_384, rid, exclude=others), fleet(**loads))).replica_id == rid
    for rid in IDS:
        loads[rid]["prefill_tokens_inflight"] = 2000
    loads["r0"] = {"latency": MODEL, "decoding_requests": 200}
    decision = decided(chooser.decide(shared(16_384, "next", slo_tpot_s=0.05), fleet(**loads)))
    assert decision.replica_id != "r0" and decision.branch is Branch.SLO_MET


def test_predicted_latency_reports_best_effort_when_no_replica_meets_the_slo() -> None:
    chooser = policy("predicted-latency")
    loads = {rid: {"latency": MODEL, "prefill_tokens_inflight": 100_000} for rid in IDS}
    request = RoutingRequest(model="m", estimated_prompt_tokens=100, slo_ttft_s=1.0)
    decision = decided(chooser.decide(request, fleet(**loads)))
    assert decision.branch is Branch.SLO_BEST_EFFORT and decision.detail.get("predicted_ttft_s") is not None
    assert decision.detail.get("predicted_ttft_s") > 1.0


def test_cost_aware_options_are_validated() -> None:
    with pytest.raises(ValueError, match="prefill_budget_tokens"):
        policy("sticky-prefix", prefill_budget_tokens=0)
    with pytest.raises(ValueError, match="ttft_penalty_s"):
        policy("predicted-latency", ttft_penalty_s=0)
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        policy("sticky-prefix", prefill_tokens_per_s=0)
    with pytest.raises(ValueError, match="unknown option"):
        policy("sticky-prefix", load_unit="tokens")
    with pytest.raises(ValueError, match="load_factor"):
        policy("sticky-prefix", load_factor=0.5)


@pytest.mark.parametrize("name", ["sticky-prefix", "predicted-latency"])
def test_indexed_pickers_say_how_unevenly_the_pool_holds_the_prefix(name: str) -> None:
    """The learned cap's affinity gate reads these: without them a prefix-affine pool routed by these
    policies read as "no affinity" and was capped (cache hit 50 % vs 67 % in a 28 req/s run)."""
    chooser = policy(name)
    request = shared(8192, "q1")
    blocks = len(request.prefix_hashes)
    first = decided(chooser.decide(request, fleet()))
    assert (first.detail.get("shared_prefix_blocks"), first.detail.get("common_prefix_blocks")) == (
        0,
        0,
    )  # nobody held it
    second = decided(chooser.decide(shared(8192, "q2"), fleet()))
    assert second.detail.get("shared_prefix_blocks") == second.detail.get(
        "matched_prefix_blocks"
    )  # it went where the prefix is
    assert (
        0 < (second.detail.get("shared_prefix_blocks") or 0) <= blocks
        and second.detail.get("common_prefix_blocks") == 0
    )
