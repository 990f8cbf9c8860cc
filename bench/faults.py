"""Fault schedules for a local fleet, and the poison fraction of a workload (parsing only, no I/O).

A schedule is a list of events (`--fault TEXT`, repeatable), each at a wall-clock offset from the start
of the measured window (the first measured send):

    at=20s kill=0                                     SIGKILL engine 0: its streams break, its port refuses
    at=40s restart=0                                  start engine 0 again: same command, same port
    at=5s replica=1 set=crash_after_tokens:20,crash_rate:0.3   POST /mock/faults on engine 1
    at=30s clear=1                                    DELETE /mock/faults on engine 1

`at` takes `s` or `ms` (a bare number is seconds); replicas are numbered from 0 as the fleet starts them.
`set` values are YAML scalars (`null`, `true`, `20`, `0.3`, `crash`) checked against the mock engine's
fault fields (`mock_engine.faults.FaultSettings`) when parsed. A restart of a replica that is still
running kills it first. A restarted engine starts from its command line's faults (the poison marker
included), not from what `set` changed at run time.

Poison (`--poison-fraction F`): that share of the requests (exactly, per block of 100, at positions
drawn by a seeded generator of its own: the same requests for every compared config) carries `marker`
at the end of its last message (or prompt), and the fleet's engines are started with `--poison-marker
MARKER --poison-effect EFFECT`, so every replica stalls, answers 500 or resets on those requests.
Warm-up requests are never poisoned.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

import yaml

from bench.workload import RequestSpec
from mock_engine.faults import POISON_EFFECTS, FaultSettings, FaultSettingsError

Action = Literal["kill", "restart", "set", "clear"]
ACTIONS: tuple[Action, ...] = ("kill", "restart", "set", "clear")
DEFAULT_POISON_MARKER = "[[bench-poison]]"


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """One scheduled fault: `action` on engine `replica`, `at_s` wall seconds into the measured window.
    `changes` (for `set`) are the mock engine's fault fields, as (name, value) pairs."""

    at_s: float
    action: Action
    replica: int
    changes: tuple[tuple[str, Any], ...] = ()

    def describe(self) -> str:
        """The event in the `--fault` syntax (parses back to the same event)."""
        at = f"at={self.at_s:g}s"
        if self.action == "set":
            pairs = ",".join(f"{k}:{_scalar(v)}" for k, v in self.changes)
            return f"{at} replica={self.replica} set={pairs}"
        return f"{at} {self.action}={self.replica}"

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"at_s": self.at_s, "action": self.action, "replica": self.replica}
        if self.changes:
            row["changes"] = dict(self.changes)
        return row


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_offset_s(text: str) -> float:
    """`10s`, `2.5s`, `500ms` or `10` (seconds) → seconds (finite, ≥ 0)."""
    raw = text.strip().lower()
    scale = 1.0
    if raw.endswith("ms"):
        raw, scale = raw[:-2], 0.001
    elif raw.endswith("s"):
        raw = raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        raise ValueError(f"not a time offset: {text!r} (use e.g. 10s or 500ms)") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a time offset must be finite and >= 0, got {text!r}")
    return value


def _replica(text: str, key: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{key}= needs a replica number, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{key}= needs a replica number >= 0, got {value}")
    return value


def parse_changes(text: str) -> tuple[tuple[str, Any], ...]:
    """`crash_after_tokens:20,crash_rate:0.3` → (("crash_after_tokens", 20), ("crash_rate", 0.3)),
    checked against the mock engine's fault fields."""
    changes: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"set: {part!r} is not FIELD:VALUE")
        changes[name.strip()] = yaml.safe_load(value.strip()) if value.strip() else None
    if not changes:
        raise ValueError("set= needs at least one FIELD:VALUE")
    try:
        FaultSettings().updated(changes)
    except FaultSettingsError as exc:
        raise ValueError(f"set: {exc}") from None
    return tuple(changes.items())


def parse_fault(text: str) -> FaultEvent:
    """One `--fault` value (see the module docstring)."""
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if not sep or not key or key in fields:
            raise ValueError(f"--fault {text!r}: {token!r} is not KEY=VALUE (or is repeated)")
        fields[key] = value
    unknown = sorted(set(fields) - {"at", "replica", *ACTIONS})
    if unknown:
        raise ValueError(f"--fault {text!r}: unknown key(s) {', '.join(unknown)}")
    if "at" not in fields:
        raise ValueError(f"--fault {text!r}: needs at=OFFSET")
    actions = [a for a in ACTIONS if a in fields]
    if len(actions) != 1:
        raise ValueError(f"--fault {text!r}: needs exactly one of kill=, restart=, set=, clear=")
    action = actions[0]
    at_s = parse_offset_s(fields["at"])
    if action == "set":
        if "replica" not in fields:
            raise ValueError(f"--fault {text!r}: set= needs replica=N")
        return FaultEvent(at_s, "set", _replica(fields["replica"], "replica"), parse_changes(fields["set"]))
    if "replica" in fields:
        raise ValueError(f"--fault {text!r}: {action}=N names the replica; drop replica=")
    return FaultEvent(at_s, action, _replica(fields[action], action))


def parse_schedule(items: Iterable[str], replicas: int) -> tuple[FaultEvent, ...]:
    """Every `--fault`, in time order (events at the same offset keep the order given)."""
    events = [parse_fault(item) for item in items]
    for event in events:
        if event.replica >= replicas:
            raise ValueError(
                f"--fault {event.describe()!r}: replica {event.replica} does not exist "
                f"(the fleet has {replicas}, numbered from 0)"
            )
    return tuple(sorted(events, key=lambda e: e.at_s))


@dataclass(frozen=True, slots=True)
class Poison:
    """`fraction` of the requests carry `marker`; the engines give them `effect`."""

    fraction: float
    marker: str = DEFAULT_POISON_MARKER
    effect: str = "stall"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.fraction) and 0.0 <= self.fraction <= 1.0):
            raise ValueError(f"--poison-fraction must be within [0, 1], got {self.fraction!r}")
        if self.effect not in POISON_EFFECTS:
            raise ValueError(
                f"--poison-effect must be one of {', '.join(POISON_EFFECTS)}, got {self.effect!r}"
            )
        if not self.marker or any(c.isspace() for c in self.marker):
            raise ValueError(f"--poison-marker must be non-empty text without spaces, got {self.marker!r}")

    def engine_args(self) -> tuple[str, ...]:
        return ("--poison-marker", self.marker, "--poison-effect", self.effect)

    def describe(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "marker": self.marker, "effect": self.effect}


def poisoned(spec: RequestSpec, marker: str) -> RequestSpec:
    """`spec` with `marker` appended to its last message (or its prompt), marked `poisoned`."""
    if spec.prompt is not None:
        return replace(spec, prompt=f"{spec.prompt} {marker}", poisoned=True)
    *head, (role, content) = spec.messages
    return replace(spec, messages=(*head, (role, f"{content} {marker}")), poisoned=True)


POISON_BLOCK = 100


def with_poison(
    specs: Iterator[RequestSpec], poison: Poison | None, seed: int, skip: int = 0
) -> Iterator[RequestSpec]:
    """Poison `poison.fraction` of `specs` after the first `skip` (the warm-up): in each block of
    `POISON_BLOCK` requests, ⌊(b+1)·B·f⌋ − ⌊b·B·f⌋ positions drawn by a generator of its own
    (`poison-<seed>`), so the share is exact to one request per block, the positions are random, and
    the requests themselves and the choice depend on nothing else."""
    if poison is None or poison.fraction <= 0:
        yield from specs
        return
    rng = random.Random(f"poison-{seed}")
    chosen: set[int] = set()
    for index, spec in enumerate(specs):
        position = index - skip
        if position >= 0 and position % POISON_BLOCK == 0:
            block = position // POISON_BLOCK
            count = math.floor((block + 1) * POISON_BLOCK * poison.fraction + 1e-9) - math.floor(
                block * POISON_BLOCK * poison.fraction + 1e-9
            )
            chosen = set(rng.sample(range(POISON_BLOCK), count))
        usable = spec.prompt is not None or bool(spec.messages)
        hit = position >= 0 and usable and position % POISON_BLOCK in chosen
        yield poisoned(spec, poison.marker) if hit else spec
