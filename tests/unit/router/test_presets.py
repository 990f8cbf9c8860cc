"""The preset registry: names, option validation, decisions' header rendering."""

from __future__ import annotations

import random

import pytest

from router.presets import PolicyContext, build_policy, known_policies
from router.types import Branch, Decision
from tests.unit.router.snapshots import decisions, policy

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
    plain = Decision(replica_id="r0", policy="prefix-affinity", branch=Branch.SPILLOVER, hops=2)
    matched = Decision(
        replica_id="r0", policy="prefix-index", branch=Branch.PREFIX_MATCH, matched_prefix_blocks=12
    )
    assert plain.header_value() == "policy=prefix-affinity; branch=spillover; hops=2"
    assert matched.header_value() == "policy=prefix-index; branch=prefix_match; hops=0; prefix_blocks=12"
