"""Policies by name: the one place a configured policy becomes a profile.

A preset is a declarative profile spec (`router.profile_spec`) built from a pool's `policy_options`,
then built through the same plugin registry as a custom profile; adding a preset is adding an entry,
not an `if`. `policy: custom` builds the pool's own `profile:` instead. Every policy takes the injected
`random.Random` (decisions are reproducible under a seed) and reads its options with
`router.options.OptionReader` (unknown names and bad values raise `ValueError` naming the option).
Every policy, custom included, accepts the routing-key options of `router.keys.KeySettings`
(`block_size_chars` 64, `max_prefix_chars` 16384, `prefix_key_blocks` 16), which the gateway reads with
`KeySettings.from_options` from the same mapping; `custom` accepts no other option.

Each preset as its profile (score_i = Σ weight · scorer_i, every scorer in [0, 1], higher is better):

    round-robin       picker round-robin                                  (no options)
    least-load        scorers inflight (requests, min-max) × 1.0 + queue (min-max) × 0.5;
                      picker max-score                                    (no options)
    power-of-two      picker power-of-two                                 (no options)
    prefix-affinity   scorers inflight (load_unit) × 1.0 + queue × 0.5;
                      picker bounded-ring {key: prefix, load_factor, load_unit, virtual_nodes_per_replica}
    session-affinity  the same with key: session
    prefix-index      scorers prefix-match × prefix_weight + queue (ratio) × load_weight
                      + prefill-tokens (ratio) × prefill_weight;
                      picker prefix-index {imbalance_abs_requests, imbalance_rel_ratio,
                      index_capacity_blocks}
    sticky-prefix     picker sticky-prefix {prefill_budget_tokens, prefill_tokens_per_s, ttft_penalty_s,
                      load_factor, index_capacity_blocks, virtual_nodes_per_replica}   (router.cost_aware)
    predicted-latency picker predicted-latency {the options of sticky-prefix}   (router.cost_aware)

Options and defaults: prefix-affinity / session-affinity take `load_factor` (c of the CHWBL bound, 1.25,
>= 1), `load_unit` (`requests` | `tokens`, default `requests`), `virtual_nodes_per_replica` (160);
prefix-index takes `prefix_weight` (2.0), `load_weight` (1.0), `prefill_weight` (1.0; 0 drops the
scorer), `prefill_floor_tokens` (0: the prefill scorer's `ratio_floor`), `imbalance_abs_requests`
(16), `imbalance_rel_ratio` (1.5, >= 1), `index_capacity_blocks`
(16384 block hashes per replica). Why the prefill term (token-aware load): the requests that set
TTFT p95 are the prefix misses, and a miss's TTFT is its own prefill plus the prefill tokens queued
ahead of it; counting requests alone sends it to a replica that holds as many requests but thousands
more tokens to prefill. With long shared prefixes it lowers TTFT p95 at the same goodput
(docs/BENCHMARKS.md, "Routing").
No preset runs a profile filter: the CHWBL bound, the imbalance guard, the τ budget and the TPOT filter
run inside their (composite) pickers; `router.filters` says why.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from router.bounded import RingKeySource
from router.keys import KEY_OPTION_NAMES, KeySettings
from router.load import LoadUnit
from router.options import OptionReader
from router.plugins import (
    STICKY_OPTIONS,
    PickerType,
    ScorerType,
    read_bound,
    read_guard,
    read_index_capacity,
    read_virtual_nodes,
)
from router.profile import Policy
from router.profile_spec import ProfileSpec, build_profile
from router.scorers import Normalisation

DEFAULT_PREFIX_WEIGHT = 2.0
DEFAULT_LOAD_WEIGHT = 1.0
DEFAULT_PREFILL_WEIGHT = 1.0
DEFAULT_PREFILL_FLOOR_TOKENS = 0.0
CUSTOM_POLICY = "custom"
"""The policy name under which a pool gives its own `profile:`."""


class PolicyName(StrEnum):
    """Preset policy names (the `policy:` key of a pool; `custom` is accepted beside them)."""

    ROUND_ROBIN = "round-robin"
    LEAST_LOAD = "least-load"
    POWER_OF_TWO = "power-of-two"
    PREFIX_AFFINITY = "prefix-affinity"
    PREFIX_INDEX = "prefix-index"
    SESSION_AFFINITY = "session-affinity"
    STICKY_PREFIX = "sticky-prefix"
    PREDICTED_LATENCY = "predicted-latency"


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy builder may use: the seeded RNG, the pool's policy options and, for `policy:
    custom` only, the pool's profile spec."""

    rng: random.Random
    options: Mapping[str, Any] = field(default_factory=dict)
    profile: ProfileSpec | None = None


@dataclass(frozen=True, slots=True)
class Preset:
    """A preset: its own option names and the function from those options to its profile spec."""

    options: frozenset[str]
    spec: Callable[[OptionReader], ProfileSpec]


def _load_scorers(unit: LoadUnit) -> list[dict[str, Any]]:
    """In-flight load in `unit` (weight 1) and in-flight + engine waiting (weight 0.5), both min-max."""
    return [
        {"type": ScorerType.INFLIGHT, "load_unit": unit, "weight": 1.0},
        {"type": ScorerType.QUEUE, "weight": 0.5},
    ]


def _least_load(read: OptionReader) -> ProfileSpec:
    """Fewest gateway in-flight requests; engine waiting queue as a lighter second signal."""
    return {"scorers": _load_scorers(LoadUnit.REQUESTS), "picker": {"type": PickerType.MAX_SCORE}}


def _bounded_ring(key: RingKeySource) -> Callable[[OptionReader], ProfileSpec]:
    """CHWBL over the pool's ring keyed by `key`; the load scorers (in the bound's unit) rank fallbacks."""

    def spec(read: OptionReader) -> ProfileSpec:
        bound = read_bound(read)
        picker = {
            "type": PickerType.BOUNDED_RING,
            "key": key,
            "load_factor": bound.load_factor,
            "load_unit": bound.unit,
            "virtual_nodes_per_replica": read_virtual_nodes(read),
        }
        return {"scorers": _load_scorers(bound.unit), "picker": picker}

    return spec


def _prefix_index(read: OptionReader) -> ProfileSpec:
    """score = prefix_weight · matched ratio + load_weight · (1 - load / max load)
    + prefill_weight · (1 - prefill tokens / max prefill tokens), guarded; a zero prefill_weight
    leaves the prefill scorer out."""
    prefix_weight = read.number("prefix_weight", DEFAULT_PREFIX_WEIGHT, minimum=0)
    load_weight = read.number("load_weight", DEFAULT_LOAD_WEIGHT, minimum=0)
    prefill_weight = read.number("prefill_weight", DEFAULT_PREFILL_WEIGHT, minimum=0)
    guard = read_guard(read)
    scorers: list[dict[str, Any]] = [
        {"type": ScorerType.PREFIX_MATCH, "weight": prefix_weight},
        {"type": ScorerType.QUEUE, "normalise": Normalisation.RATIO, "weight": load_weight},
    ]
    prefill_floor = read.number("prefill_floor_tokens", DEFAULT_PREFILL_FLOOR_TOKENS, minimum=0)
    if prefill_weight > 0:
        prefill: dict[str, Any] = {
            "type": ScorerType.PREFILL_TOKENS,
            "normalise": Normalisation.RATIO,
            "weight": prefill_weight,
        }
        if prefill_floor > 0:
            prefill["ratio_floor"] = prefill_floor
        scorers.append(prefill)
    return {
        "scorers": scorers,
        "picker": {
            "type": PickerType.PREFIX_INDEX,
            "imbalance_abs_requests": guard.abs_margin_requests,
            "imbalance_rel_ratio": guard.rel_margin_ratio,
            "index_capacity_blocks": read_index_capacity(read),
        },
    }


def _cost_aware(picker: PickerType) -> Callable[[OptionReader], ProfileSpec]:
    """A cost-aware picker (router.cost_aware) with the options given; it needs no scorers."""

    def spec(read: OptionReader) -> ProfileSpec:
        given = read.names() & _COST_AWARE_OPTIONS
        return {"picker": {"type": picker, **{k: read.raw(k) for k in sorted(given)}}}

    return spec


_COST_AWARE_OPTIONS = STICKY_OPTIONS
_RING_OPTIONS = frozenset({"load_factor", "load_unit", "virtual_nodes_per_replica"})
_PREFIX_INDEX_OPTIONS = frozenset(
    {
        "prefix_weight",
        "load_weight",
        "prefill_weight",
        "prefill_floor_tokens",
        "imbalance_abs_requests",
        "imbalance_rel_ratio",
        "index_capacity_blocks",
    }
)

PRESETS: dict[str, Preset] = {
    PolicyName.ROUND_ROBIN: Preset(frozenset(), lambda _: {"picker": {"type": PickerType.ROUND_ROBIN}}),
    PolicyName.LEAST_LOAD: Preset(frozenset(), _least_load),
    PolicyName.POWER_OF_TWO: Preset(frozenset(), lambda _: {"picker": {"type": PickerType.POWER_OF_TWO}}),
    PolicyName.PREFIX_AFFINITY: Preset(_RING_OPTIONS, _bounded_ring(RingKeySource.PREFIX)),
    PolicyName.PREFIX_INDEX: Preset(_PREFIX_INDEX_OPTIONS, _prefix_index),
    PolicyName.SESSION_AFFINITY: Preset(_RING_OPTIONS, _bounded_ring(RingKeySource.SESSION)),
    PolicyName.STICKY_PREFIX: Preset(_COST_AWARE_OPTIONS, _cost_aware(PickerType.STICKY_PREFIX)),
    PolicyName.PREDICTED_LATENCY: Preset(_COST_AWARE_OPTIONS, _cost_aware(PickerType.PREDICTED_LATENCY)),
}


def _reader(name: str, options: Mapping[str, Any], own_options: frozenset[str]) -> OptionReader:
    """Reject unknown option names and validate the shared routing-key options up front."""
    where = f"policy {name}"
    read = OptionReader(options, where)
    read.reject_unknown(own_options | KEY_OPTION_NAMES)
    KeySettings.from_options(options, where)
    return read


def _preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join([*sorted(PRESETS), CUSTOM_POLICY])
        raise KeyError(f"unknown policy {name!r}; known: {known}") from None


def preset_spec(name: str, options: Mapping[str, Any] | None = None) -> ProfileSpec:
    """The declarative profile spec of preset `name` under `options` (what `build_policy` builds)."""
    options = {} if options is None else options
    preset = _preset(name)
    return preset.spec(_reader(name, options, preset.options))


def build_policy(name: str, ctx: PolicyContext) -> Policy:
    """Build the named policy; raises `KeyError` naming the known policies for an unknown name and
    `ValueError` naming the option or profile key for an unknown option, plugin type or bad value."""
    if name == CUSTOM_POLICY:
        _reader(name, ctx.options, frozenset())
        if ctx.profile is None:
            raise ValueError(f"policy {CUSTOM_POLICY}: needs a profile (filters, scorers, picker)")
        return build_profile(CUSTOM_POLICY, ctx.profile, ctx.rng)
    spec = preset_spec(name, ctx.options)
    if ctx.profile is not None:
        raise ValueError(f"policy {name}: a profile is read only with policy {CUSTOM_POLICY}")
    return build_profile(name, spec, ctx.rng)


def known_policies() -> list[str]:
    """Preset names accepted by `build_policy` (which also accepts `custom` with a profile)."""
    return sorted(str(name) for name in PRESETS)
