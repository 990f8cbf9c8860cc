"""Profile specs: the declarative spelling of a routing profile, read into a `router.profile.Profile`.

A profile spec (a pool's `profile:` in the config, or a preset's declarative spelling,
`router.presets`) is a mapping

    filters: [{type: <filter type>, <option>: <value>, ...}, ...]      optional, run in order
    scorers: [{type: <scorer type>, weight: <w ≥ 0, default 1>, <option>: <value>, ...}, ...]   optional
    picker:  {type: <picker type>, <option>: <value>, ...}               required

whose types are the ones `router.plugins` registers (with their options and defaults). An unknown key,
an unknown type, an unknown option or a bad value raises `ValueError` naming the key. Apart from the
registry because this is the reading of the spec's shape; the registry is what the types are.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

from router.options import OptionReader
from router.plugins import FILTERS, PICKERS, SCORERS, BuildContext, PluginType
from router.profile import Filter, Profile, WeightedScorer

_PluginT = TypeVar("_PluginT")

ProfileSpec = Mapping[str, Any]
"""`{filters: [...], scorers: [...], picker: {...}}`, as read from YAML."""

DEFAULT_SCORER_WEIGHT = 1.0


class SpecKey(StrEnum):
    """The keys of a profile spec."""

    FILTERS = "filters"
    SCORERS = "scorers"
    PICKER = "picker"


def _plugin_reader(
    kind: str,
    registry: Mapping[str, PluginType[_PluginT]],
    entry: Any,
    where: str,
    extra_options: frozenset[str] = frozenset(),
) -> tuple[PluginType[_PluginT], OptionReader]:
    """Look the entry's `type` up and return it with a reader over the rest (unknown options rejected)."""
    known = ", ".join(sorted(registry))
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: must be a mapping with a 'type' ({kind} types: {known}), got {entry!r}")
    type_name = entry.get("type")
    if not isinstance(type_name, str) or type_name not in registry:
        raise ValueError(f"{where}: unknown {kind} type {type_name!r}; known: {known}")
    plugin = registry[type_name]
    read = OptionReader({k: v for k, v in entry.items() if k != "type"}, f"{where} ({type_name})")
    read.reject_unknown(plugin.options | extra_options)
    return plugin, read


def _entries(spec: ProfileSpec, key: SpecKey, where: str) -> list[Any]:
    """The list under `key`; absent or null means empty."""
    entries = spec.get(key)
    if entries is None:
        return []
    if not isinstance(entries, list | tuple):
        raise ValueError(f"{where}.{key}: must be a list of {{type: …}} entries, got {entries!r}")
    return list(entries)


def _scorer(entry: Any, where: str, ctx: BuildContext) -> WeightedScorer:
    plugin, read = _plugin_reader("scorer", SCORERS, entry, where, frozenset({"weight"}))
    weight = read.number("weight", DEFAULT_SCORER_WEIGHT, minimum=0)
    return WeightedScorer(plugin.build(read, ctx), weight=weight)


def _filter(entry: Any, where: str, ctx: BuildContext) -> Filter:
    plugin, read = _plugin_reader("filter", FILTERS, entry, where)
    return plugin.build(read, ctx)


def build_profile(name: str, spec: ProfileSpec, rng: random.Random, where: str = "profile") -> Profile:
    """Build the profile `spec` describes, reporting `name` as its policy. `ValueError` names the key.

    The picker is built first (it may create the prefix index the scorers read), then the scorers and
    filters in the order given.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: must be a mapping of filters, scorers and picker, got {spec!r}")
    unknown = sorted(str(key) for key in spec if key not in set(SpecKey))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: filters, scorers, picker")
    if SpecKey.PICKER not in spec:
        raise ValueError(f"{where}.picker: required; known picker types: {', '.join(sorted(PICKERS))}")
    ctx = BuildContext(rng)
    picker_type, read = _plugin_reader("picker", PICKERS, spec[SpecKey.PICKER], f"{where}.picker")
    picker = picker_type.build(read, ctx)
    scorers = [
        _scorer(entry, f"{where}.scorers.{i}", ctx)
        for i, entry in enumerate(_entries(spec, SpecKey.SCORERS, where))
    ]
    filters = [
        _filter(entry, f"{where}.filters.{i}", ctx)
        for i, entry in enumerate(_entries(spec, SpecKey.FILTERS, where))
    ]
    return Profile(name, picker=picker, scorers=scorers, filters=filters, prefix_index=ctx.prefix_index)
