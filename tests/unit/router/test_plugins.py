"""The plugin registry: presets equal their declarative spelling, filters, new scorers, custom profiles
and errors that name the key."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.bounded import LoadBound
from router.filters import ImbalanceFilter, LoadBoundFilter
from router.plugins import plugin_types
from router.prefix_index import ImbalanceGuard
from router.presets import CUSTOM_POLICY, PolicyContext, build_policy, known_policies, preset_spec
from router.profile_spec import build_profile
from router.types import Branch, EngineLoad, RoutingRequest
from tests.unit.router.snapshots import IDS, decided, decisions, fleet, policy, replica

LOAD_SCORERS = """
scorers:
  - {type: inflight, weight: 1.0}
  - {type: queue, weight: 0.5}
"""

SPELLINGS: dict[str, tuple[dict[str, Any], str]] = {
    "round-robin": ({}, "picker: {type: round-robin}"),
    "least-load": ({}, LOAD_SCORERS + "picker: {type: max-score}"),
    "power-of-two": ({}, "picker: {type: power-of-two}"),
    "prefix-affinity": ({}, LOAD_SCORERS + "picker: {type: bounded-ring, key: prefix}"),
    "session-affinity": ({}, LOAD_SCORERS + "picker: {type: bounded-ring, key: session}"),
    "prefix-index": (
        {},
        """
        scorers:
          - {type: prefix-match, weight: 2.0}
          - {type: queue, normalise: ratio, weight: 1.0}
          - {type: prefill-tokens, normalise: ratio, weight: 1.0}
        picker: {type: prefix-index}
        """,
    ),
    "sticky-prefix": ({}, "picker: {type: sticky-prefix}"),
    "predicted-latency": ({}, "picker: {type: predicted-latency}"),
}

SPELLINGS_WITH_OPTIONS: list[tuple[str, dict[str, Any], str]] = [
    (
        "prefix-affinity",
        {"load_factor": 1.0, "load_unit": "tokens", "virtual_nodes_per_replica": 7},
        """
        scorers:
          - {type: inflight, load_unit: tokens}
          - {type: queue, weight: 0.5}
        picker: {type: bounded-ring, key: prefix, load_factor: 1.0, load_unit: tokens,
                 virtual_nodes_per_replica: 7}
        """,
    ),
    (
        "session-affinity",
        {"load_factor": 2.0},
        LOAD_SCORERS + "picker: {type: bounded-ring, key: session, load_factor: 2}",
    ),
    (
        "prefix-index",
        {
            "prefix_weight": 0.5,
            "imbalance_abs_requests": 2,
            "imbalance_rel_ratio": 1.1,
            "index_capacity_blocks": 5,
        },
        """
        scorers:
          - {type: prefix-match, weight: 0.5}
          - {type: queue, normalise: ratio}
        picker: {type: prefix-index, imbalance_abs_requests: 2, imbalance_rel_ratio: 1.1,
                 index_capacity_blocks: 5}
        """,
    ),
    (
        "sticky-prefix",
        {"prefill_budget_tokens": 3000, "virtual_nodes_per_replica": 9, "index_capacity_blocks": 64},
        "picker: {type: sticky-prefix, prefill_budget_tokens: 3000, virtual_nodes_per_replica: 9,"
        " index_capacity_blocks: 64}",
    ),
    (
        "predicted-latency",
        {"prefill_tokens_per_s": 16000, "ttft_penalty_s": 0.25},
        "picker: {type: predicted-latency, prefill_tokens_per_s: 16000, ttft_penalty_s: 0.25}",
    ),
]


def profile(spec: str | dict[str, Any], seed: int = 0, name: str = CUSTOM_POLICY) -> Any:
    loaded = yaml.safe_load(spec) if isinstance(spec, str) else spec
    return build_profile(name, loaded, random.Random(seed))


def error_of(spec: str | dict[str, Any]) -> str:
    with pytest.raises(ValueError) as info:
        profile(spec)
    return str(info.value)


CASES = [pytest.param(name, options, text, id=name) for name, (options, text) in SPELLINGS.items()] + [
    pytest.param(name, options, text, id=f"{name}-with-options")
    for name, options, text in SPELLINGS_WITH_OPTIONS
]


@pytest.mark.parametrize(("name", "options", "spelling"), CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_preset_decides_exactly_as_its_declarative_spelling(
    name: str, options: dict[str, Any], spelling: str, seed: int
) -> None:
    preset = decisions(policy(name, seed=seed, **options), seed=100 + seed)
    spelled = decisions(profile(spelling, seed=seed, name=name), seed=100 + seed)
    assert preset == spelled
    made = [d for d in preset if d is not None]
    assert len(made) > 150 and len({d.replica_id for d in made}) >= 4, "a varied, mostly routable sequence"


def test_the_spellings_cover_every_preset_and_preset_spec_builds_the_same() -> None:
    assert sorted(SPELLINGS) == known_policies()
    for name in SPELLINGS:
        rebuilt = build_profile(name, preset_spec(name), random.Random(3))
        assert decisions(rebuilt, seed=9) == decisions(policy(name, seed=3), seed=9)


def test_the_registry_lists_every_type() -> None:
    assert plugin_types() == {
        "filters": ["imbalance-guard", "load-bound"],
        "scorers": ["inflight", "kv-usage", "prefill-tokens", "prefix-match", "queue", "running"],
        "pickers": [
            "bounded-ring",
            "max-score",
            "power-of-two",
            "predicted-latency",
            "prefix-index",
            "ring",
            "round-robin",
            "sticky-prefix",
        ],
    }


class TestFilters:
    def test_load_bound_keeps_the_candidates_under_the_bound(self) -> None:
        loads = {"r0": 9, "r1": 0, "r2": 1, "r3": 2}
        replicas = fleet(**{rid: {"inflight_requests": n} for rid, n in loads.items()})
        # bound = ceil(1.0 * (12 + 1) / 4) = 4: r0 is over it
        kept = LoadBoundFilter(LoadBound(1.0))(RoutingRequest(model="m"), replicas)
        assert [r.replica_id for r in kept] == ["r1", "r2", "r3"]

    def test_imbalance_guard_keeps_the_least_loaded_only_when_imbalanced(self) -> None:
        guard = ImbalanceFilter(ImbalanceGuard(abs_margin_requests=4, rel_margin_ratio=1.5))
        request = RoutingRequest(model="m")
        skewed = fleet(r0={"inflight_requests": 20}, r1={"inflight_requests": 2}, r3={"inflight_requests": 9})
        assert [r.replica_id for r in guard(request, skewed)] == ["r2"]
        tied = fleet(r0={"inflight_requests": 20}, r2={"inflight_requests": 1}, r3={"inflight_requests": 1})
        assert [r.replica_id for r in guard(request, tied)] == ["r1"]
        even = fleet(r0={"inflight_requests": 4}, r1={"inflight_requests": 1})
        assert guard(request, even) == even

    def test_a_profile_runs_its_filters_before_scoring(self) -> None:
        chosen = profile(
            """
            filters: [{type: imbalance-guard, imbalance_abs_requests: 4}]
            scorers: [{type: kv-usage}]
            picker: {type: max-score}
            """
        )
        busy_but_empty_cache = {"inflight_requests": 30, "engine": EngineLoad(kv_usage_ratio=0.0)}
        idle_but_full = {"inflight_requests": 1, "engine": EngineLoad(kv_usage_ratio=0.9)}
        replicas = fleet(
            r0=busy_but_empty_cache, r1=idle_but_full, r2={"inflight_requests": 5}, r3=idle_but_full
        )
        decision = decided(chosen.decide(RoutingRequest(model="m"), replicas))
        assert decision.candidates == 2, "the guard left r1 and r3"
        assert decision.replica_id in {"r1", "r3"} and decision.policy == CUSTOM_POLICY

    @pytest.mark.parametrize(
        ("key", "preset"), [("prefix", "prefix-affinity"), ("session", "session-affinity")]
    )
    def test_load_bound_then_ring_agrees_with_bounded_ring_on_keyed_requests(
        self, key: str, preset: str
    ) -> None:
        split = profile(f"filters: [{{type: load-bound}}]\n{LOAD_SCORERS}picker: {{type: ring, key: {key}}}")
        bounded = policy(preset)
        rng = random.Random(5)
        spilled = 0
        for _ in range(300):
            request = RoutingRequest(model="m", prefix_key=rng.getrandbits(64), session_key=str(rng.random()))
            replicas = fleet(**{rid: {"inflight_requests": rng.randint(0, 12)} for rid in IDS})
            a = decided(split.decide(request, replicas))
            b = decided(bounded.decide(request, replicas))
            assert (a.replica_id, a.branch, a.detail.get("hops", 0)) == (
                b.replica_id,
                b.branch,
                b.detail.get("hops", 0),
            )
            spilled += b.detail.get("hops", 0) > 0
        assert spilled > 30, "the bound moved some requests along the ring"


class TestScorers:
    def test_kv_usage_prefers_the_emptiest_cache_and_ignores_stale_samples(self) -> None:
        chosen = profile("scorers: [{type: kv-usage}]\npicker: {type: max-score}")
        replicas = [
            replica("r0", engine=EngineLoad(kv_usage_ratio=0.7)),
            replica("r1", engine=EngineLoad(kv_usage_ratio=0.2)),
            replica("r2", engine=EngineLoad(kv_usage_ratio=0.9)),
        ]
        assert decided(chosen.decide(RoutingRequest(model="m"), replicas)).replica_id == "r1"
        stale = [*replicas[:2], replica("r2", engine=EngineLoad(kv_usage_ratio=0.9, stale=True))]
        assert decided(chosen.decide(RoutingRequest(model="m"), stale)).replica_id == "r2"

    def test_weights_combine_the_scorers(self) -> None:
        # r0: fewest in-flight requests, r1: fewest in-flight tokens
        replicas = [
            replica("r0", inflight_requests=1, inflight_tokens=9000),
            replica("r1", inflight_requests=3, inflight_tokens=100),
        ]
        by_tokens = profile(
            """
            scorers: [{type: inflight, weight: 0.2}, {type: inflight, load_unit: tokens, weight: 1}]
            picker: {type: max-score}
            """
        )
        by_requests = profile(
            """
            scorers: [{type: inflight, weight: 1}, {type: inflight, load_unit: tokens, weight: 0.2}]
            picker: {type: max-score}
            """
        )
        request = RoutingRequest(model="m")
        assert decided(by_tokens.decide(request, replicas)).replica_id == "r1"
        assert decided(by_requests.decide(request, replicas)).branch is Branch.LEAST_LOAD
        assert decided(by_requests.decide(request, replicas)).replica_id == "r0"


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("picker: {type: magic}", ["profile.picker", "'magic'", "max-score"]),
        (
            "scorers: [{type: queue}, {type: cache}]\npicker: {type: max-score}",
            ["profile.scorers.1", "'cache'"],
        ),
        ("filters: [{type: nope}]\npicker: {type: ring}", ["profile.filters.0", "'nope'", "load-bound"]),
        ("scorers: [{weight: 1}]\npicker: {type: ring}", ["profile.scorers.0", "unknown scorer type None"]),
        (
            "scorers: [{type: queue, normalize: ratio}]\npicker: {type: ring}",
            ["profile.scorers.0", "normalize"],
        ),
        ("picker: {type: ring, load_factor: 2}", ["profile.picker (ring)", "load_factor"]),
        (
            "scorers: [{type: queue, normalise: log}]\npicker: {type: ring}",
            ["scorers.0 (queue)", "'normalise'"],
        ),
        ("scorers: [{type: queue, weight: -1}]\npicker: {type: ring}", ["scorers.0 (queue)", "'weight'"]),
        ("scorers: [{type: queue, weight: 'x'}]\npicker: {type: ring}", ["scorers.0 (queue)", "'weight'"]),
        (
            "filters: [{type: load-bound, load_factor: 0.5}]\npicker: {type: ring}",
            ["filters.0", "'load_factor'"],
        ),
        ("picker: {type: bounded-ring, key: user}", ["profile.picker (bounded-ring)", "'key'"]),
        ("picker: {type: prefix-index, index_capacity_blocks: 0}", ["picker", "'index_capacity_blocks'"]),
        (
            "scorers: [{type: prefix-match}]\npicker: {type: max-score}",
            ["scorers.0", "needs picker prefix-index"],
        ),
        ("scorers: {type: queue}\npicker: {type: ring}", ["profile.scorers", "list"]),
        ("scorers: [queue]\npicker: {type: ring}", ["profile.scorers.0", "mapping"]),
        ("scorers: [{type: queue}]", ["profile.picker", "required"]),
        ("picker: {type: ring}\nfilter: []", ["profile", "unknown key(s) filter"]),
        ("[1, 2]", ["profile", "mapping"]),
    ],
)
def test_errors_name_the_key(spec: str, names: list[str]) -> None:
    message = error_of(spec)
    for name in names:
        assert name in message


class TestCustomPolicy:
    SPEC = yaml.safe_load("scorers: [{type: queue}]\npicker: {type: max-score}")

    def test_custom_builds_the_profile_it_is_given(self) -> None:
        built = build_policy(
            CUSTOM_POLICY, PolicyContext(random.Random(0), {"block_size_chars": 32}, self.SPEC)
        )
        replicas = fleet(
            r0={"inflight_requests": 3}, r1={"engine": EngineLoad(waiting=2)}, r2={"inflight_requests": 1}
        )
        decision = decided(built.decide(RoutingRequest(model="m"), replicas))
        assert (decision.replica_id, decision.policy) == ("r3", "custom")

    def test_custom_needs_a_profile_and_only_key_options(self) -> None:
        with pytest.raises(ValueError, match="needs a profile"):
            build_policy(CUSTOM_POLICY, PolicyContext(random.Random(0)))
        with pytest.raises(ValueError, match="load_factor"):
            build_policy(CUSTOM_POLICY, PolicyContext(random.Random(0), {"load_factor": 2}, self.SPEC))

    def test_a_preset_refuses_a_profile(self) -> None:
        with pytest.raises(ValueError, match="only with policy custom"):
            build_policy("least-load", PolicyContext(random.Random(0), profile=self.SPEC))


def test_the_documented_profile_block_builds() -> None:
    page = Path(__file__).resolve().parents[3].joinpath("docs", "ROUTING.md").read_text()
    section = page.split("## Custom profiles", 1)[1]
    pool = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert pool["policy"] == CUSTOM_POLICY
    assert profile(pool["profile"]).name == CUSTOM_POLICY
