"""Load engine profiles from YAML: by built-in name (`mock_engine/profiles/NAME.yaml`) or by path.

Every error is a `ProfileError` whose message names the source and the dotted key, e.g.
`profile 'x.yaml': gpu.hbm_bytes: expected a number, got 'lots'`. Unknown keys are errors too, so a typo
never silently falls back to a default. Numbers may be written as YAML ints/floats or as numeric
strings (PyYAML reads `80e9` as a string: YAML 1.1 wants `80.0e+9`), so `80e9` is accepted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import yaml

from mock_engine.physics.kv_link import KV_LINK_PRESETS, KvLink
from mock_engine.physics.profile import (
    CalibrationTarget,
    DecodeSpec,
    EngineProfile,
    GpuSpec,
    ModelGeometry,
    PrefillSpec,
    ProfileError,
    SchedulerSpec,
)

DEFAULT_PROFILE_NAME = "h100-13b-fp16"
_SECTIONS = (
    "name",
    "description",
    "model",
    "gpu",
    "prefill",
    "decode",
    "scheduler",
    "calibration",
    "kv_link",
)


class _Section:
    """Typed reads from one mapping of the document, with errors naming `prefix.key`."""

    def __init__(self, data: object, path: str, source: str) -> None:
        self._source = source
        self._path = path
        if not isinstance(data, Mapping):
            self.fail(path, f"expected a mapping, got {type(data).__name__}")
        self._data: Mapping[Any, Any] = data

    def fail(self, key: str, message: str) -> NoReturn:
        raise ProfileError(f"profile {self._source!r}: {key}: {message}")

    def key(self, name: str) -> str:
        return f"{self._path}.{name}" if self._path else name

    def check_keys(self, allowed: tuple[str, ...]) -> None:
        for name in self._data:
            if name not in allowed:
                self.fail(self.key(str(name)), f"unknown key (allowed: {', '.join(allowed)})")

    def section(self, name: str) -> _Section:
        if name not in self._data:
            self.fail(self.key(name), "missing")
        return _Section(self._data[name], self.key(name), self._source)

    def number(self, name: str, default: float | None = None, minimum: float = 0.0) -> float:
        """A finite float ≥ `minimum` (numeric strings accepted, booleans refused)."""
        value = self._raw(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            self.fail(self.key(name), f"expected a number, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            self.fail(self.key(name), f"expected a number, got {value!r}")
        if not math.isfinite(number) or number < minimum:
            self.fail(self.key(name), f"must be a finite number >= {minimum}, got {value!r}")
        return number

    def positive(self, name: str, default: float | None = None) -> float:
        number = self.number(name, default)
        if number <= 0:
            self.fail(self.key(name), f"must be > 0, got {number!r}")
        return number

    def integer(self, name: str, default: int | None = None) -> int:
        """A whole number ≥ 1 (floats like 26.0e+9 are accepted when integral)."""
        number = self.positive(name, default)
        if not number.is_integer():
            self.fail(self.key(name), f"expected a whole number, got {number!r}")
        return int(number)

    def optional_integer(self, name: str) -> int | None:
        return self.integer(name) if self.has(name) else None

    def has(self, name: str) -> bool:
        return self._data.get(name) is not None

    def text(self, name: str, default: str | None = None) -> str:
        value = self._raw(name, default)
        if not isinstance(value, str) or not value:
            self.fail(self.key(name), f"expected a non-empty string, got {value!r}")
        return value

    def items(self, name: str) -> list[_Section]:
        value = self._raw(name, None)
        if not isinstance(value, list):
            self.fail(self.key(name), f"expected a list, got {type(value).__name__}")
        return [_Section(item, f"{self.key(name)}[{i}]", self._source) for i, item in enumerate(value)]

    def _raw(self, name: str, default: object) -> object:
        if name in self._data and self._data[name] is not None:
            return self._data[name]
        if default is None:
            self.fail(self.key(name), "missing")
        return default


def available_profiles() -> list[str]:
    """Names of the built-in profiles (the YAML files shipped in `mock_engine/profiles/`)."""
    folder = resources.files("mock_engine") / "profiles"
    return sorted(
        entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml")
    )


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE_NAME) -> EngineProfile:
    """A built-in profile by name (`tiny`, `h100-13b-fp16`) or a profile from a `.yaml`/`.yml` path."""
    text_name = str(name_or_path)
    if isinstance(name_or_path, Path) or text_name.endswith((".yaml", ".yml")):
        path = Path(name_or_path)
        if not path.is_file():
            raise ProfileError(f"profile {text_name!r}: no such file")
        return parse_profile(yaml.safe_load(path.read_text(encoding="utf-8")), source=text_name)
    if text_name not in available_profiles():
        known = ", ".join(available_profiles())
        raise ProfileError(f"profile {text_name!r}: unknown name (built-in profiles: {known})")
    resource = resources.files("mock_engine") / "profiles" / f"{text_name}.yaml"
    return parse_profile(yaml.safe_load(resource.read_text(encoding="utf-8")), source=text_name)


def parse_profile(document: object, source: str = "<mapping>") -> EngineProfile:
    """Validate a parsed YAML document (a mapping with the sections of the shipped profiles)."""
    root = _Section(document, "", source)
    root.check_keys(_SECTIONS)
    context_tokens, targets = _parse_calibration(root)
    name = root.text("name")
    description = root.text("description") if root.has("description") else ""
    model = _parse_model(root.section("model"))
    gpu = _parse_gpu(root.section("gpu"))
    prefill = _parse_prefill(root.section("prefill"))
    decode = _parse_decode(root.section("decode"))
    scheduler = _parse_scheduler(root.section("scheduler"))
    kv_link = _parse_kv_link(root.section("kv_link")) if root.has("kv_link") else None
    try:
        return EngineProfile(
            name, model, gpu, prefill, decode, scheduler, context_tokens, targets, description, kv_link
        )
    except ProfileError as error:  # cross-section checks of EngineProfile.__post_init__
        raise ProfileError(f"profile {source!r}: {error}") from None


def _parse_model(section: _Section) -> ModelGeometry:
    section.check_keys(("n_layers", "n_kv_heads", "d_head", "bytes_per_element", "weight_bytes"))
    return ModelGeometry(
        n_layers=section.integer("n_layers"),
        n_kv_heads=section.integer("n_kv_heads"),
        d_head=section.integer("d_head"),
        bytes_per_element=section.integer("bytes_per_element"),
        weight_bytes=section.integer("weight_bytes"),
    )


def _parse_gpu(section: _Section) -> GpuSpec:
    section.check_keys(("hbm_bytes", "overhead_bytes", "memory_bandwidth_bytes_per_s"))
    overhead = section.number("overhead_bytes", default=0.0)
    if not overhead.is_integer():
        section.fail(section.key("overhead_bytes"), f"expected a whole number, got {overhead!r}")
    return GpuSpec(
        hbm_bytes=section.integer("hbm_bytes"),
        overhead_bytes=int(overhead),
        memory_bandwidth_bytes_per_s=section.positive("memory_bandwidth_bytes_per_s"),
    )


def _parse_prefill(section: _Section) -> PrefillSpec:
    section.check_keys(("tokens_per_s", "chunk_tokens_per_step"))
    return PrefillSpec(
        tokens_per_s=section.positive("tokens_per_s"),
        chunk_tokens_per_step=section.optional_integer("chunk_tokens_per_step"),
    )


def _parse_decode(section: _Section) -> DecodeSpec:
    section.check_keys(("kv_read_efficiency_ratio", "step_overhead_s"))
    efficiency = section.positive("kv_read_efficiency_ratio")
    if efficiency > 1:
        section.fail(section.key("kv_read_efficiency_ratio"), f"must be <= 1, got {efficiency!r}")
    return DecodeSpec(
        kv_read_efficiency_ratio=efficiency,
        step_overhead_s=section.number("step_overhead_s", default=0.0),
    )


def _parse_scheduler(section: _Section) -> SchedulerSpec:
    section.check_keys(("max_num_seqs", "block_size_tokens"))
    return SchedulerSpec(
        max_num_seqs=section.integer("max_num_seqs"),
        block_size_tokens=section.integer("block_size_tokens"),
    )


def _parse_calibration(root: _Section) -> tuple[int, tuple[CalibrationTarget, ...]]:
    if not root.has("calibration"):
        return 800, ()
    section = root.section("calibration")
    section.check_keys(("context_tokens", "targets"))
    targets: list[CalibrationTarget] = []
    for item in section.items("targets"):
        item.check_keys(("batch_size", "per_stream_tok_s"))
        targets.append(CalibrationTarget(item.integer("batch_size"), item.positive("per_stream_tok_s")))
    return section.integer("context_tokens", default=800), tuple(targets)


def _parse_kv_link(section: _Section) -> KvLink:
    """`{preset: nvlink|rdma|tcp}` or `{bandwidth_bytes_per_s: B, latency_s: L}` (latency optional)."""
    section.check_keys(("preset", "bandwidth_bytes_per_s", "latency_s"))
    if section.has("preset"):
        name = section.text("preset")
        if name not in KV_LINK_PRESETS or section.has("bandwidth_bytes_per_s"):
            known = ", ".join(KV_LINK_PRESETS)
            section.fail(section.key("preset"), f"expected one of {known} alone, got {name!r}")
        return KV_LINK_PRESETS[name]
    bandwidth = section.positive("bandwidth_bytes_per_s")
    return KvLink("custom", bandwidth, section.number("latency_s", default=0.0))
