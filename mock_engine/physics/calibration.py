"""Measure a profile's decode speed by running the core on a fake clock, next to the profile's targets.

For each batch size B, B requests arrive together at t = 0 with no shared prefix, prompt
P = context - D/2 tokens and D = `decode_tokens` outputs each, so the context averages ≈ `context`
over the run. The measurement window opens when the last request has its first token (every sequence
is decoding, prefill is over) and closes when the first request finishes (the batch is still full):

    per_stream_tok_s = mean over requests of (tokens in window) / window_s
    aggregate_tok_s  = (all tokens in window) / window_s

This is the engine's own scheduler at work (chunked prefill, KV limits), not the closed formula, so the
table checks the whole core. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from mock_engine.core import EngineRequest, TokenEvent
from mock_engine.physics.engine import PhysicsCore
from mock_engine.physics.profile import EngineProfile

DEFAULT_DECODE_TOKENS = 128


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """One batch size: measured speeds and the profile's target (None when it states none)."""

    batch_size: int
    context_tokens: int
    measured_per_stream_tok_s: float
    measured_aggregate_tok_s: float
    target_per_stream_tok_s: float | None

    @property
    def target_aggregate_tok_s(self) -> float | None:
        """batch_size · target_per_stream_tok_s."""
        target = self.target_per_stream_tok_s
        return None if target is None else target * self.batch_size

    @property
    def error_ratio(self) -> float | None:
        """measured / target - 1 for the per-stream speed."""
        target = self.target_per_stream_tok_s
        return None if target is None else self.measured_per_stream_tok_s / target - 1.0


def calibrate(
    profile: EngineProfile,
    batch_sizes: tuple[int, ...] | None = None,
    context_tokens: int | None = None,
    decode_tokens: int = DEFAULT_DECODE_TOKENS,
) -> list[CalibrationRow]:
    """One row per batch size (default: the profile's target batch sizes, else 1/16/64/128)."""
    targets = {target.batch_size: target.per_stream_tok_s for target in profile.calibration_targets}
    sizes = batch_sizes or tuple(targets) or (1, 16, 64, 128)
    context = context_tokens or profile.calibration_context_tokens
    rows = []
    for batch_size in sizes:
        per_stream, aggregate = measure_decode(profile, batch_size, context, decode_tokens)
        rows.append(CalibrationRow(batch_size, context, per_stream, aggregate, targets.get(batch_size)))
    return rows


def measure_decode(
    profile: EngineProfile, batch_size: int, context_tokens: int, decode_tokens: int
) -> tuple[float, float]:
    """(per-stream tok/s, aggregate tok/s) of `batch_size` concurrent streams (module docstring)."""
    if decode_tokens < 4 or context_tokens <= decode_tokens // 2:
        raise ValueError("need decode_tokens >= 4 and context_tokens > decode_tokens / 2")
    core = PhysicsCore(profile)
    prompt_tokens = context_tokens - decode_tokens // 2
    for index in range(batch_size):
        core.submit(EngineRequest(f"calibrate-{index}", "", prompt_tokens, decode_tokens, 0.0))
    times_by_request: dict[str, list[float]] = defaultdict(list)
    for event in _run_to_completion(core):
        times_by_request[event.request_id].append(event.time_s)
    window_start_s = max(times[0] for times in times_by_request.values())
    window_end_s = min(times[-1] for times in times_by_request.values())
    if window_end_s <= window_start_s:
        raise ValueError(f"batch {batch_size}: no window where all streams decode; raise decode_tokens")
    window_s = window_end_s - window_start_s
    counts = [
        sum(1 for t in times if window_start_s < t <= window_end_s) for times in times_by_request.values()
    ]
    return sum(counts) / len(counts) / window_s, sum(counts) / window_s


def _run_to_completion(core: PhysicsCore) -> list[TokenEvent]:
    """Drive the core with a fake clock, jumping from event to event until it is idle."""
    events: list[TokenEvent] = []
    while (next_s := core.next_event_s()) is not None:
        events.extend(core.advance(next_s))
    return events


def render_calibration_markdown(profile_name: str, rows: list[CalibrationRow]) -> str:
    """A markdown table: batch, context, measured and target per-stream/aggregate tok/s, error."""
    lines = [
        f"Calibration of profile `{profile_name}` (decode at fixed batch size, simulated time)",
        "",
        "| batch | context tokens | per-stream tok/s | target | aggregate tok/s | target | error |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.batch_size} | {row.context_tokens} | {row.measured_per_stream_tok_s:,.1f} "
            f"| {_fmt(row.target_per_stream_tok_s, '{:,.0f}')} | {row.measured_aggregate_tok_s:,.0f} "
            f"| {_fmt(row.target_aggregate_tok_s, '{:,.0f}')} | {_fmt(row.error_ratio, '{:+.1%}')} |"
        )
    return "\n".join(lines) + "\n"


def _fmt(value: float | None, pattern: str) -> str:
    return "—" if value is None else pattern.format(value)
