"""The preset registry: names, option validation, decisions' header rendering, the documented pipelines."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from router.presets import PolicyContext, build_policy, known_policies, preset_spec
from router.types import Branch, Decision, ReplicaView, RoutingRequest
from tests.unit.router.snapshots import decided, decisions, fleet, policy

ALL = [
    "least-load",
    "power-of-two",
    "predicted-latency",
    "prefix-affinity",
    "prefix-index",
    "round-robin",
    "session-affinity",
    "sticky-prefix",
]


def test_known_policies_lists_every_preset_as_plain_strings() -> None:
    assert known_policies() == ALL
    assert all(type(name) is str for name in known_policies())


@pytest.mark.parametrize("name", ALL)
def test_every_preset_builds_with_defaults_and_reports_its_name(name: str) -> None:
    built = build_policy(name, PolicyContext(rng=random.Random(0)))
    assert built.name == name


@pytest.mark.parametrize("name", ALL)
def test_every_preset_accepts_the_routing_key_options_and_decides_as_without_them(name: str) -> None:
    with_keys = policy(name, block_size_chars=32, max_prefix_chars=4096, prefix_key_blocks=8)
    made = decisions(with_keys, seed=7)
    assert with_keys.name == name
    assert made == decisions(policy(name), seed=7), "key options shape the keys, not the policy"
    assert sum(d is not None for d in made) > 100


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="least-load"):
        build_policy("random", PolicyContext(rng=random.Random(0)))


@pytest.mark.parametrize(
    ("name", "options", "offending"),
    [
        ("prefix-affinity", {"load_factr": 2}, "load_factr"),
        ("round-robin", {"load_factor": 2}, "load_factor"),
        ("prefix-affinity", {"load_factor": 0.5}, "load_factor"),
        ("session-affinity", {"load_unit": "bytes"}, "load_unit"),
        ("session-affinity", {"virtual_nodes_per_replica": 0}, "virtual_nodes_per_replica"),
        ("prefix-index", {"index_capacity_blocks": True}, "index_capacity_blocks"),
        ("prefix-index", {"imbalance_rel_ratio": 0.5}, "imbalance_rel_ratio"),
        ("prefix-index", {"prefix_weight": "high"}, "prefix_weight"),
        ("power-of-two", {"block_size_chars": 0}, "block_size_chars"),
    ],
)
def test_bad_options_raise_naming_the_option(name: str, options: dict[str, object], offending: str) -> None:
    with pytest.raises(ValueError, match=offending):
        build_policy(name, PolicyContext(rng=random.Random(0), options=options))


def test_header_value_renders_policy_branch_hops_and_prefix_blocks() -> None:
    plain = Decision(replica_id="r0", policy="prefix-affinity", branch=Branch.SPILLOVER, detail={"hops": 2})
    matched = Decision(
        replica_id="r0",
        policy="prefix-index",
        branch=Branch.PREFIX_MATCH,
        detail={"matched_prefix_blocks": 12},
    )
    assert plain.header_value() == "policy=prefix-affinity; branch=spillover; hops=2"
    assert matched.header_value() == "policy=prefix-index; branch=prefix_match; hops=0; prefix_blocks=12"


def _unmatched(**fields: object) -> RoutingRequest:
    return RoutingRequest(model="m", estimated_prompt_tokens=2000, prefix_hashes=(91, 92, 93), **fields)  # type: ignore[arg-type]


def _miss_heavy_fleet() -> list[ReplicaView]:
    """r2 holds one request more than the others but far fewer uncached tokens to prefill."""
    heavy = {"inflight_requests": 4, "prefill_tokens_inflight": 6000}
    return fleet(r0=heavy, r1=heavy, r2={"inflight_requests": 5, "prefill_tokens_inflight": 200}, r3=heavy)


def test_prefix_index_sends_a_miss_to_the_replica_with_the_fewest_prefill_tokens_queued() -> None:
    # r2 holds one request more than the others but far fewer tokens to prefill: a miss queued there
    # starts its own prefill first. Counting requests alone (prefill_weight 0) avoids r2.
    views = _miss_heavy_fleet()
    assert decided(policy("prefix-index").decide(_unmatched(), views)).replica_id == "r2"
    by_count = decided(policy("prefix-index", prefill_weight=0).decide(_unmatched(), views))
    assert by_count.replica_id != "r2"


def test_prefix_index_keeps_a_matched_request_on_its_owner_whatever_its_prefill_queue() -> None:
    index_policy = policy("prefix-index")
    owner = decided(index_policy.decide(_unmatched(), fleet())).replica_id
    loaded = fleet(**{owner: {"prefill_tokens_inflight": 8000}})
    assert decided(index_policy.decide(_unmatched(), loaded)).replica_id == owner


def test_prefix_index_refuses_a_negative_prefill_weight() -> None:
    with pytest.raises(ValueError, match="prefill_weight"):
        policy("prefix-index", prefill_weight=-1)


def test_a_prefill_floor_keeps_small_prefill_differences_from_outweighing_the_request_count() -> None:
    # Every request a hit: r0 holds 128 uncached tokens and 4 requests, r1 none and 8 requests. Without
    # a floor 128 tokens count as a full point (as much as the whole request term) and r1 wins; with a
    # floor of 2,048 they count 0.06 and the less loaded r0 wins.
    views = fleet(
        ("r0", "r1"),
        r0={"inflight_requests": 4, "prefill_tokens_inflight": 128},
        r1={"inflight_requests": 8, "prefill_tokens_inflight": 0},
    )
    assert decided(policy("prefix-index").decide(_unmatched(), views)).replica_id == "r1"
    floored = policy("prefix-index", prefill_floor_tokens=2048)
    assert decided(floored.decide(_unmatched(), views)).replica_id == "r0"


def test_a_prefill_floor_leaves_a_miss_heavy_queue_to_the_plain_ratio() -> None:
    views = _miss_heavy_fleet()
    floored = policy("prefix-index", prefill_floor_tokens=2048)
    assert decided(floored.decide(_unmatched(), views)).replica_id == "r2"


def _documented_pipelines() -> dict[str, tuple[list[str], list[str], str]]:
    """ROUTING.md's "What each policy runs" table: policy → (filter types, scorer types, picker type)."""
    page = Path(__file__).resolve().parents[3].joinpath("docs", "ROUTING.md").read_text()
    table = page.split("## What each policy runs", 1)[1].split("| policy |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        policy_cell, filters, scorers, picker = line.split("|")[1:5]
        rows[policy_cell.strip(" `")] = (
            re.findall(r"`([a-z-]+)`", filters),
            re.findall(r"`([a-z-]+)`", scorers),
            picker.strip(" `"),
        )
    return rows


def test_routing_md_lists_each_preset_s_filters_scorers_and_picker() -> None:
    documented = _documented_pipelines()
    assert sorted(documented) == ALL
    for name in ALL:
        spec = preset_spec(name)
        types = (
            [entry["type"] for entry in spec.get("filters", [])],
            [entry["type"] for entry in spec.get("scorers", [])],
            spec["picker"]["type"],
        )
        assert documented[name] == types, name
