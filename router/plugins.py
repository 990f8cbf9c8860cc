"""The plugin registry: filter, scorer and picker types by name, their options and their builders.

A profile spec names these types (`router.profile_spec` reads a spec into a `router.profile.Profile`).
Each entry's options are read with `router.options.OptionReader`: an unknown option or a bad value
raises `ValueError` naming the key (e.g. `profile.scorers.1 (queue): option 'normalise' must be one of …`).

Types (defaults in parentheses; the first value of a choice is its default):

    filters (router.filters; soft: when none would pass, all are kept)
      load-bound       the CHWBL bound: load_factor (1.25, ≥ 1), load_unit (requests | tokens)
      imbalance-guard  only the least loaded when imbalanced: imbalance_abs_requests (16, ≥ 0),
                       imbalance_rel_ratio (1.5, ≥ 1)
    scorers (router.scorers, router.prefix_index); every scorer also takes weight (1.0, ≥ 0)
      inflight         gateway in-flight load: load_unit (requests | tokens), normalise (min-max | ratio)
      queue            in-flight + fresh engine waiting requests: normalise (min-max | ratio)
      kv-usage         engine KV-cache usage, stale or missing samples count 0: normalise (min-max | ratio)
      prefix-match     matched leading blocks / request blocks; no options; needs a picker with an index
                       (prefix-index, sticky-prefix, predicted-latency)
      prefill-tokens   uncached prefill tokens in flight (token-aware load): normalise (min-max | ratio),
                       ratio_floor (0, ≥ 0; ratio: 1 − x / max(max x, floor))
      running          decoding sequences (gateway count, or the engine's fresh running when larger):
                       normalise (min-max | ratio)
    pickers (router.pickers, router.bounded, router.prefix_index, router.cost_aware); "composite: a → b"
    names the narrowing stage a composite picker runs inside, over every candidate (router.filters)
      round-robin      cycles in replica-id order; no options
      max-score        best combined score, seeded tie-break (branch least_load); no options
      power-of-two     the less loaded of two random candidates; no options
      ring             consistent hashing, the first candidate clockwise from the key: key (prefix |
                       session), virtual_nodes_per_replica (160); keeps a private prefix index as a
                       witness of where blocks went (reported, not routed on: router.bounded)
      bounded-ring     CHWBL, composite: load bound → ring walk; the options of ring and load-bound
      prefix-index     composite: imbalance guard → best score; records where prefixes went: the options
                       of imbalance-guard, index_capacity_blocks (16384, ≥ 1)
      sticky-prefix    sticky until saturated (router.cost_aware), composite: preference order → τ budget
                       and count bound → the first that passes, else the least queued:
                       prefill_budget_tokens (none, ≥ 1), prefill_tokens_per_s (none, > 0), ttft_penalty_s
                       (0.5, > 0), load_factor (1.5, ≥ 1; null: no count bound), index_capacity_blocks,
                       virtual_nodes_per_replica
      predicted-latency  the SLO-aware pick on the learned latency models, composite: predictions → TPOT
                       filter (prefix holders spared) → least predicted TTFT; sticky-prefix while the
                       models are cold: the options of sticky-prefix

A profile owns at most one prefix index: picker `prefix-index` creates it and scorer `prefix-match` reads
the same one; the profile exposes it as `prefix_index` (shared across instances by the gateway). Only
the picker draws from the seeded `random.Random`; building draws nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from router.bounded import (
    DEFAULT_LOAD_FACTOR,
    RING_KEYS,
    BoundedRingPicker,
    LoadBound,
    RingKeySource,
)
from router.cost_aware import (
    DEFAULT_STICKY_LOAD_FACTOR,
    DEFAULT_TTFT_PENALTY_S,
    PredictedLatencyPicker,
    PrefillBudget,
    StickyPrefixPicker,
    prefill_tokens_metric,
)
from router.filters import ImbalanceFilter, LoadBoundFilter
from router.indexed_picker import PrefixIndexPicker
from router.load import LoadUnit, running_sequences
from router.options import OptionReader
from router.pickers import MaxScorePicker, PowerOfTwoPicker, RoundRobinPicker
from router.prefix_index import (
    DEFAULT_CAPACITY_BLOCKS_PER_REPLICA,
    DEFAULT_IMBALANCE_ABS_REQUESTS,
    DEFAULT_IMBALANCE_REL_RATIO,
    ImbalanceGuard,
    PrefixIndex,
    PrefixMatchScorer,
)
from router.profile import Filter, Picker, Scorer
from router.ring import DEFAULT_VIRTUAL_NODES_PER_REPLICA
from router.scorers import (
    InvertedMetricScorer,
    Normalisation,
    inflight_scorer,
    kv_usage_scorer,
    queue_scorer,
)

_PluginT = TypeVar("_PluginT")


class FilterType(StrEnum):
    LOAD_BOUND = "load-bound"
    IMBALANCE_GUARD = "imbalance-guard"


class ScorerType(StrEnum):
    INFLIGHT = "inflight"
    QUEUE = "queue"
    KV_USAGE = "kv-usage"
    PREFIX_MATCH = "prefix-match"
    PREFILL_TOKENS = "prefill-tokens"
    RUNNING = "running"


class PickerType(StrEnum):
    ROUND_ROBIN = "round-robin"
    MAX_SCORE = "max-score"
    POWER_OF_TWO = "power-of-two"
    RING = "ring"
    BOUNDED_RING = "bounded-ring"
    PREFIX_INDEX = "prefix-index"
    STICKY_PREFIX = "sticky-prefix"
    PREDICTED_LATENCY = "predicted-latency"


@dataclass(slots=True)
class BuildContext:
    """State shared by the plugins of one profile while it is built."""

    rng: random.Random
    prefix_index: PrefixIndex | None = None


@dataclass(frozen=True, slots=True)
class PluginType(Generic[_PluginT]):
    """A registered type: the option names it accepts and its builder."""

    options: frozenset[str]
    build: Callable[[OptionReader, BuildContext], _PluginT]


_BOUND_OPTIONS = frozenset({"load_factor", "load_unit"})
_GUARD_OPTIONS = frozenset({"imbalance_abs_requests", "imbalance_rel_ratio"})
_RING_OPTIONS = frozenset({"key", "virtual_nodes_per_replica"})


def read_bound(read: OptionReader) -> LoadBound:
    """`load_factor` (1.25, ≥ 1) and `load_unit` (requests) as a CHWBL `LoadBound`."""
    return LoadBound(
        load_factor=read.number("load_factor", DEFAULT_LOAD_FACTOR, minimum=1.0),
        unit=read.choice("load_unit", LoadUnit, LoadUnit.REQUESTS),
    )


def read_guard(read: OptionReader) -> ImbalanceGuard:
    """`imbalance_abs_requests` (16, ≥ 0) and `imbalance_rel_ratio` (1.5, ≥ 1) as an `ImbalanceGuard`."""
    return ImbalanceGuard(
        abs_margin_requests=read.number("imbalance_abs_requests", DEFAULT_IMBALANCE_ABS_REQUESTS, minimum=0),
        rel_margin_ratio=read.number("imbalance_rel_ratio", DEFAULT_IMBALANCE_REL_RATIO, minimum=1.0),
    )


def read_virtual_nodes(read: OptionReader) -> int:
    """`virtual_nodes_per_replica` (160, ≥ 1)."""
    return read.integer("virtual_nodes_per_replica", DEFAULT_VIRTUAL_NODES_PER_REPLICA, minimum=1)


def read_index_capacity(read: OptionReader) -> int:
    """`index_capacity_blocks` (16384 block hashes per replica, ≥ 1)."""
    return read.integer("index_capacity_blocks", DEFAULT_CAPACITY_BLOCKS_PER_REPLICA, minimum=1)


def read_prefill_budget(read: OptionReader) -> PrefillBudget:
    """`prefill_budget_tokens` (none, ≥ 1), `prefill_tokens_per_s` (none, > 0), `ttft_penalty_s` (0.5)."""
    budget = read.optional_integer("prefill_budget_tokens", minimum=1)
    rate = read.optional_number("prefill_tokens_per_s", minimum=0)
    if rate is not None and rate <= 0:
        raise ValueError(f"{read.where}: option 'prefill_tokens_per_s' must be > 0, got {rate!r}")
    penalty = read.number("ttft_penalty_s", DEFAULT_TTFT_PENALTY_S, minimum=0)
    if penalty <= 0:
        raise ValueError(f"{read.where}: option 'ttft_penalty_s' must be > 0, got {penalty!r}")
    return PrefillBudget(budget_tokens=budget, prefill_tokens_per_s=rate, ttft_penalty_s=penalty)


def _normalise(read: OptionReader) -> Normalisation:
    return read.choice("normalise", Normalisation, Normalisation.MIN_MAX)


def _inflight(read: OptionReader, ctx: BuildContext) -> Scorer:
    return inflight_scorer(read.choice("load_unit", LoadUnit, LoadUnit.REQUESTS), _normalise(read))


def _prefix_match(read: OptionReader, ctx: BuildContext) -> Scorer:
    if ctx.prefix_index is None:
        raise ValueError(f"{read.where}: needs picker {PickerType.PREFIX_INDEX}, which records the prefixes")
    return PrefixMatchScorer(ctx.prefix_index)


def _ring(read: OptionReader, ctx: BuildContext, bound: LoadBound | None) -> Picker:
    key_of, branches = RING_KEYS[read.choice("key", RingKeySource, RingKeySource.PREFIX)]
    return BoundedRingPicker(key_of, bound, branches, ctx.rng, read_virtual_nodes(read))


def _prefix_index(read: OptionReader, ctx: BuildContext) -> Picker:
    capacity = read_index_capacity(read)
    guard = read_guard(read)
    ctx.prefix_index = PrefixIndex(capacity)
    return PrefixIndexPicker(ctx.prefix_index, guard, ctx.rng)


def _sticky(read: OptionReader, ctx: BuildContext) -> StickyPrefixPicker:
    ctx.prefix_index = PrefixIndex(read_index_capacity(read))
    factor: float | None = DEFAULT_STICKY_LOAD_FACTOR
    if "load_factor" in read.names():
        factor = read.optional_number("load_factor", minimum=1.0)  # null: no count bound
    bound = None if factor is None else LoadBound(load_factor=factor)
    return StickyPrefixPicker(
        ctx.prefix_index, read_prefill_budget(read), ctx.rng, read_virtual_nodes(read), bound
    )


def _predicted_latency(read: OptionReader, ctx: BuildContext) -> Picker:
    fallback = _sticky(read, ctx)
    assert ctx.prefix_index is not None
    return PredictedLatencyPicker(ctx.prefix_index, fallback, ctx.rng)


FILTERS: dict[str, PluginType[Filter]] = {
    FilterType.LOAD_BOUND: PluginType(_BOUND_OPTIONS, lambda read, _: LoadBoundFilter(read_bound(read))),
    FilterType.IMBALANCE_GUARD: PluginType(_GUARD_OPTIONS, lambda read, _: ImbalanceFilter(read_guard(read))),
}

_NORMALISE = frozenset({"normalise"})

SCORERS: dict[str, PluginType[Scorer]] = {
    ScorerType.INFLIGHT: PluginType(_NORMALISE | {"load_unit"}, _inflight),
    ScorerType.QUEUE: PluginType(_NORMALISE, lambda read, _: queue_scorer(_normalise(read))),
    ScorerType.KV_USAGE: PluginType(_NORMALISE, lambda read, _: kv_usage_scorer(_normalise(read))),
    ScorerType.PREFIX_MATCH: PluginType(frozenset(), _prefix_match),
    ScorerType.PREFILL_TOKENS: PluginType(
        _NORMALISE | {"ratio_floor"},
        lambda read, _: InvertedMetricScorer(
            "prefill_tokens",
            prefill_tokens_metric,
            _normalise(read),
            read.number("ratio_floor", 0.0, minimum=0),
        ),
    ),
    ScorerType.RUNNING: PluginType(
        _NORMALISE, lambda read, _: InvertedMetricScorer("running", running_sequences, _normalise(read))
    ),
}

STICKY_OPTIONS = frozenset(  # the options of pickers (and presets) sticky-prefix and predicted-latency
    {
        "prefill_budget_tokens",
        "prefill_tokens_per_s",
        "ttft_penalty_s",
        "index_capacity_blocks",
        "virtual_nodes_per_replica",
        "load_factor",
    }
)

PICKERS: dict[str, PluginType[Picker]] = {
    PickerType.ROUND_ROBIN: PluginType(frozenset(), lambda read, ctx: RoundRobinPicker()),
    PickerType.MAX_SCORE: PluginType(frozenset(), lambda read, ctx: MaxScorePicker(ctx.rng)),
    PickerType.POWER_OF_TWO: PluginType(frozenset(), lambda read, ctx: PowerOfTwoPicker(ctx.rng)),
    PickerType.RING: PluginType(_RING_OPTIONS, lambda read, ctx: _ring(read, ctx, None)),
    PickerType.BOUNDED_RING: PluginType(
        _RING_OPTIONS | _BOUND_OPTIONS, lambda read, ctx: _ring(read, ctx, read_bound(read))
    ),
    PickerType.PREFIX_INDEX: PluginType(_GUARD_OPTIONS | {"index_capacity_blocks"}, _prefix_index),
    PickerType.STICKY_PREFIX: PluginType(STICKY_OPTIONS, _sticky),
    PickerType.PREDICTED_LATENCY: PluginType(STICKY_OPTIONS, _predicted_latency),
}


def plugin_types() -> dict[str, list[str]]:
    """Every registered type name by kind (for docs and error messages)."""
    return {
        "filters": sorted(str(name) for name in FILTERS),
        "scorers": sorted(str(name) for name in SCORERS),
        "pickers": sorted(str(name) for name in PICKERS),
    }
