"""Named workloads (the field's common defaults and this project's four routing workloads), parameter
overrides from the command line, and JSONL trace files.

Trace format, one JSON object per line (blank lines and lines starting with `#` are skipped):

    {"messages": [{"role": "user", "content": "…"}], "max_tokens": 128,
     "session_id": "c1", "priority": "interactive", "group": "g3", "at_s": 0.25}

`prompt` (a string) replaces `messages` for /v1/completions; `max_tokens` defaults to 128; the other keys
are optional (`"poisoned": true` marks a request whose text carries a poison marker, for the report).
`at_s` (seconds from the start) is used by `--arrival trace`. `bench run --dump-workload` writes any
generator in this format, so a run can be replayed exactly.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.generators import LongContextMix, MultiTurn, NoSharing, SharedPrefix, ZipfPrefixes
from bench.workload import RequestSpec, Workload

PRESETS: dict[str, Callable[[], Workload]] = {
    # SGLang bench_serving's generated-shared-prefix defaults (64 groups × 16 prompts, 2048/128/256).
    "shared-prefix": SharedPrefix,
    "shared-prefix-small": lambda: SharedPrefix(
        groups=16, prompts_per_group=8, prefix_tokens=1024, question_tokens=64, output_tokens=64
    ),
    "multi-turn": MultiTurn,
    "zipf": ZipfPrefixes,
    # vLLM benchmark_serving's random dataset defaults (1024 in, 128 out), no sharing.
    "no-sharing": NoSharing,
    "long-context": LongContextMix,
    "tiny": lambda: NoSharing(prompt_tokens=16, output_tokens=8, name="tiny"),
}


def preset_help() -> str:
    lines = []
    for name, factory in PRESETS.items():
        params = ", ".join(f"{k}={v}" for k, v in factory().describe().items() if k != "name")
        lines.append(f"{name} ({params})")
    return "; ".join(lines)


def build_workload(name: str, params: Iterable[str] = ()) -> Workload:
    """The preset `name` with `key=value` overrides of its fields (`groups=8`, `exponent=1.2`)."""
    try:
        workload = PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(PRESETS)} (or --trace)") from None
    changes: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(workload)}  # type: ignore[arg-type]
    for item in params:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields or key == "name":
            known = ", ".join(k for k in fields if k != "name")
            raise ValueError(f"workload {name}: bad parameter {item!r}; known: {known}")
        default = getattr(workload, key)
        changes[key] = type(default)(text) if not isinstance(default, bool) else text.lower() == "true"
    return dataclasses.replace(workload, **changes)  # type: ignore[type-var]


@dataclass(frozen=True, slots=True)
class TraceWorkload:
    """Replays a JSONL trace (finite; repeats from the top when the run asks for more)."""

    path: str
    repeat: bool = True
    name: str = "trace"

    def requests(self, seed: int) -> Iterator[RequestSpec]:
        specs = read_trace(Path(self.path))
        if not specs:
            raise ValueError(f"trace {self.path} has no requests")
        return itertools.cycle(specs) if self.repeat else iter(specs)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path}

    def arrival_times_s(self) -> tuple[float, ...]:
        times = tuple(s.at_s for s in read_trace(Path(self.path)) if s.at_s is not None)
        if not times:
            raise ValueError(f"trace {self.path} has no at_s timestamps for --arrival trace")
        return times


def spec_from_json(row: dict[str, Any], where: str) -> RequestSpec:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a line must be a JSON object")
    messages: tuple[tuple[str, str], ...] = ()
    prompt = row.get("prompt")
    if prompt is None:
        raw = row.get("messages")
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"{where}: needs 'messages' (a non-empty list) or 'prompt'")
        messages = tuple((str(m.get("role", "user")), str(m.get("content", ""))) for m in raw)
    elif not isinstance(prompt, str):
        raise ValueError(f"{where}: 'prompt' must be a string")
    at_s = row.get("at_s")
    return RequestSpec(
        messages=messages,
        prompt=prompt,
        max_tokens=int(row.get("max_tokens", 128)),
        session_id=_opt_str(row.get("session_id")),
        priority=_opt_str(row.get("priority")),
        group=_opt_str(row.get("group")),
        at_s=float(at_s) if at_s is not None else None,
        poisoned=row.get("poisoned") is True,
    )


def read_trace(path: Path) -> list[RequestSpec]:
    specs = []
    with path.open() as handle:
        for number, line in enumerate(handle, start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc.msg}") from None
            specs.append(spec_from_json(row, f"{path}:{number}"))
    return specs


def write_trace(path: Path, specs: Iterable[RequestSpec]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w") as handle:
        for spec in specs:
            handle.write(json.dumps(spec.to_json()) + "\n")
            count += 1
    return count


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
