"""Policy presets by name: the one place a configured policy name becomes a profile.

The registry maps a `PolicyName` to a builder; adding a policy is adding an entry, not an `if`.
Every builder takes the injected `random.Random` so decisions are reproducible under a seed, and reads
its options from `PolicyContext.options` (unknown names and bad values raise `ValueError` naming the
option). Every policy also accepts the routing-key options of `router.keys.KeySettings`
(`block_size_chars` 64, `max_prefix_chars` 16384, `prefix_key_blocks` 16), which the gateway reads
with `KeySettings.from_options` from the same mapping.

- round-robin, least-load, power-of-two: no options of their own.
- prefix-affinity, session-affinity: `load_factor` (c of the CHWBL bound, 1.25, >= 1), `load_unit`
  (`requests` | `tokens`, default `requests`), `virtual_nodes_per_replica` (160).
- prefix-index: `prefix_weight` (2.0), `load_weight` (1.0), `imbalance_abs_requests` (16),
  `imbalance_rel_ratio` (1.5, >= 1), `index_capacity_blocks` (16384 block hashes per replica).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from router.bounded import (
    DEFAULT_LOAD_FACTOR,
    PREFIX_BRANCHES,
    SESSION_BRANCHES,
    BoundedRingPicker,
    LoadBound,
    RingBranches,
    RingKey,
    prefix_ring_key,
    session_ring_key,
)
from router.keys import KEY_OPTION_NAMES, KeySettings
from router.load import LoadUnit
from router.options import OptionReader
from router.pickers import MaxScorePicker, PowerOfTwoPicker, RoundRobinPicker
from router.prefix_index import (
    DEFAULT_CAPACITY_BLOCKS_PER_REPLICA,
    DEFAULT_IMBALANCE_ABS_REQUESTS,
    DEFAULT_IMBALANCE_REL_RATIO,
    ImbalanceGuard,
    PrefixIndex,
    PrefixIndexPicker,
    PrefixMatchScorer,
)
from router.profile import Policy, Profile, WeightedScorer
from router.ring import DEFAULT_VIRTUAL_NODES_PER_REPLICA
from router.scorers import inflight_scorer, load_scorer, queue_ratio_scorer, queue_scorer

DEFAULT_PREFIX_WEIGHT = 2.0
DEFAULT_LOAD_WEIGHT = 1.0


class PolicyName(StrEnum):
    """Configured policy names (the `policy:` key of a pool)."""

    ROUND_ROBIN = "round-robin"
    LEAST_LOAD = "least-load"
    POWER_OF_TWO = "power-of-two"
    PREFIX_AFFINITY = "prefix-affinity"
    PREFIX_INDEX = "prefix-index"
    SESSION_AFFINITY = "session-affinity"


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a preset builder may use: the seeded RNG and the pool's policy options."""

    rng: random.Random
    options: Mapping[str, Any] = field(default_factory=dict)


PolicyBuilder = Callable[[PolicyContext], Policy]

_RING_OPTIONS = frozenset({"load_factor", "load_unit", "virtual_nodes_per_replica"})
_PREFIX_INDEX_OPTIONS = frozenset(
    {"prefix_weight", "load_weight", "imbalance_abs_requests", "imbalance_rel_ratio", "index_capacity_blocks"}
)


def _reader(name: PolicyName, ctx: PolicyContext, own_options: frozenset[str] = frozenset()) -> OptionReader:
    """Reject unknown option names and validate the shared routing-key options up front."""
    where = f"policy {name}"
    read = OptionReader(ctx.options, where)
    read.reject_unknown(own_options | KEY_OPTION_NAMES)
    KeySettings.from_options(ctx.options, where)
    return read


def _round_robin(ctx: PolicyContext) -> Policy:
    _reader(PolicyName.ROUND_ROBIN, ctx)
    return Profile(PolicyName.ROUND_ROBIN, picker=RoundRobinPicker())


def _least_load(ctx: PolicyContext) -> Policy:
    """Fewest gateway in-flight requests; engine waiting queue as a lighter second signal."""
    _reader(PolicyName.LEAST_LOAD, ctx)
    return Profile(
        PolicyName.LEAST_LOAD,
        picker=MaxScorePicker(ctx.rng),
        scorers=(
            WeightedScorer(inflight_scorer(), weight=1.0),
            WeightedScorer(queue_scorer(), weight=0.5),
        ),
    )


def _power_of_two(ctx: PolicyContext) -> Policy:
    """Two random eligible replicas; the one with fewer in-flight + engine-waiting requests."""
    _reader(PolicyName.POWER_OF_TWO, ctx)
    return Profile(PolicyName.POWER_OF_TWO, picker=PowerOfTwoPicker(ctx.rng))


def _bounded_ring(name: PolicyName, ctx: PolicyContext, key_of: RingKey, branches: RingBranches) -> Policy:
    """CHWBL over the pool's ring; the load scorers (in the bound's unit) rank the fallbacks."""
    read = _reader(name, ctx, _RING_OPTIONS)
    bound = LoadBound(
        load_factor=read.number("load_factor", DEFAULT_LOAD_FACTOR, minimum=1.0),
        unit=read.choice("load_unit", LoadUnit, LoadUnit.REQUESTS),
    )
    virtual_nodes = read.integer("virtual_nodes_per_replica", DEFAULT_VIRTUAL_NODES_PER_REPLICA, minimum=1)
    return Profile(
        name,
        picker=BoundedRingPicker(key_of, bound, branches, ctx.rng, virtual_nodes),
        scorers=(
            WeightedScorer(load_scorer(bound.unit), weight=1.0),
            WeightedScorer(queue_scorer(), weight=0.5),
        ),
    )


def _prefix_affinity(ctx: PolicyContext) -> Policy:
    """Ring keyed by the prefix key (first K blocks), bounded load."""
    return _bounded_ring(PolicyName.PREFIX_AFFINITY, ctx, prefix_ring_key, PREFIX_BRANCHES)


def _session_affinity(ctx: PolicyContext) -> Policy:
    """Ring keyed by the session key, bounded load; affinity is a preference, never a pin."""
    return _bounded_ring(PolicyName.SESSION_AFFINITY, ctx, session_ring_key, SESSION_BRANCHES)


def _prefix_index(ctx: PolicyContext) -> Policy:
    """score = prefix_weight * matched ratio + load_weight * (1 - load / max load), guarded."""
    read = _reader(PolicyName.PREFIX_INDEX, ctx, _PREFIX_INDEX_OPTIONS)
    index = PrefixIndex(read.integer("index_capacity_blocks", DEFAULT_CAPACITY_BLOCKS_PER_REPLICA, minimum=1))
    guard = ImbalanceGuard(
        abs_margin_requests=read.number("imbalance_abs_requests", DEFAULT_IMBALANCE_ABS_REQUESTS, minimum=0),
        rel_margin_ratio=read.number("imbalance_rel_ratio", DEFAULT_IMBALANCE_REL_RATIO, minimum=1.0),
    )
    return Profile(
        PolicyName.PREFIX_INDEX,
        picker=PrefixIndexPicker(index, guard, ctx.rng),
        scorers=(
            WeightedScorer(
                PrefixMatchScorer(index),
                weight=read.number("prefix_weight", DEFAULT_PREFIX_WEIGHT, minimum=0),
            ),
            WeightedScorer(
                queue_ratio_scorer(), weight=read.number("load_weight", DEFAULT_LOAD_WEIGHT, minimum=0)
            ),
        ),
    )


PRESETS: dict[str, PolicyBuilder] = {
    PolicyName.ROUND_ROBIN: _round_robin,
    PolicyName.LEAST_LOAD: _least_load,
    PolicyName.POWER_OF_TWO: _power_of_two,
    PolicyName.PREFIX_AFFINITY: _prefix_affinity,
    PolicyName.PREFIX_INDEX: _prefix_index,
    PolicyName.SESSION_AFFINITY: _session_affinity,
}


def build_policy(name: str, ctx: PolicyContext) -> Policy:
    """Build the named policy; raises `KeyError` naming the known policies for an unknown name and
    `ValueError` naming the option for an unknown option or a bad value."""
    try:
        builder = PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise KeyError(f"unknown policy {name!r}; known: {known}") from None
    return builder(ctx)


def known_policies() -> list[str]:
    """Names accepted by `build_policy`."""
    return sorted(str(name) for name in PRESETS)
