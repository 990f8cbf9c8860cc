"""The overhead report: JSON plus a markdown table of each figure against the project's target."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.serve_profile import render_profile
from bench.streams import StreamLevel

# (figure, how to read it from the result, target text, target test)
Check = tuple[str, Callable[[dict[str, Any]], float | None], str, Callable[[float], bool]]


def _get(*path: str | int) -> Callable[[dict[str, Any]], float | None]:
    def read(result: dict[str, Any]) -> float | None:
        node: Any = result
        for key in path:
            if node is None:
                return None
            node = node.get(key) if isinstance(node, dict) else node[key]
        return None if node is None else float(node)

    return read


def _mean_cpu(phase: str) -> Callable[[dict[str, Any]], float | None]:
    def read(result: dict[str, Any]) -> float | None:
        readings = [
            r["schedstat_us"] for r in (result.get(phase) or {}).get("gateway_cpu_us_per_request", [])
        ]
        values = [float(v) for v in readings if v is not None]
        return sum(values) / len(values) if values else None

    return read


def _max_sustained(path: str) -> Callable[[dict[str, Any]], float | None]:
    def read(result: dict[str, Any]) -> float | None:
        levels = [lv for lv in result.get("streams", []) if lv["path"] == path and lv["sustained"]]
        return float(max(lv["streams"] for lv in levels)) if levels else None

    return read


CHECKS: tuple[Check, ...] = (
    ("added latency p50, c=1 (ms)", _get("latency", "e2e_ms", "added", "p50"), "≤ 0.4", lambda v: v <= 0.4),
    ("added latency p99, c=1 (ms)", _get("latency", "e2e_ms", "added", "p99"), "≤ 1", lambda v: v <= 1.0),
    (
        "added streamed TTFT p50 (ms)",
        _get("stream_latency", "ttft_ms", "added", "p50"),
        "≤ 0.5",
        lambda v: v <= 0.5,
    ),
    ("added streamed e2e p50 (ms)", _get("stream_latency", "e2e_ms", "added", "p50"), "–", lambda v: True),
    (
        "gateway CPU per request (µs)",
        _get("latency", "gateway_cpu_us_per_request", "stat_us"),
        "≤ 250",
        lambda v: v <= 250,
    ),
    (
        "same, from schedstat (ns clock)",
        _get("latency", "gateway_cpu_us_per_request", "schedstat_us"),
        "≤ 250",
        lambda v: v <= 250,
    ),
    ("gateway CPU per request at max req/s (µs)", _mean_cpu("throughput"), "≤ 250", lambda v: v <= 250),
    (
        "gateway CPU per 33-chunk stream (µs)",
        _get("stream_latency", "gateway_cpu_us_per_request", "stat_us"),
        "≤ 800",
        lambda v: v <= 800,
    ),
    ("max req/s direct", _get("throughput", "direct_rps"), "–", lambda v: True),
    ("max req/s through the gateway", _get("throughput", "gateway_rps"), "–", lambda v: True),
    ("throughput gateway ÷ direct", _get("throughput", "ratio"), "≥ 0.7", lambda v: v >= 0.7),
    ("concurrent streams sustained, gateway", _max_sustained("gateway"), "≥ 512", lambda v: v >= 512),
    ("concurrent streams sustained, direct", _max_sustained("direct"), "–", lambda v: True),
)


def _mean_cpu_of(phase: str, server: str) -> Callable[[dict[str, Any]], float | None]:
    def read(result: dict[str, Any]) -> float | None:
        readings = (result.get(phase) or {}).get(f"{server}_cpu_us_per_request", [])
        values = [float(r["schedstat_us"]) for r in readings if r.get("schedstat_us") is not None]
        return sum(values) / len(values) if values else None

    return read


def _rps_ratio(phase: str, server: str) -> Callable[[dict[str, Any]], float | None]:
    return _get(phase, "ratio" if server == "gateway" else f"{server}_ratio")


def _added(phase: str, metric: str, server: str, pct: str) -> Callable[[dict[str, Any]], float | None]:
    return _get(phase, metric, "added" if server == "gateway" else f"added_{server}", pct)


# (figure, reader of one server's value, target of gateway ÷ reference)
Versus = tuple[str, Callable[[str], Callable[[dict[str, Any]], float | None]], str]

VERSUS: tuple[Versus, ...] = (
    ("CPU µs per non-streamed request, closed loop", lambda s: _mean_cpu_of("throughput", s), "≤ 1.0"),
    ("CPU µs per stream, closed loop", lambda s: _mean_cpu_of("stream_throughput", s), "≤ 1.0"),
    (
        "CPU µs per non-streamed request, c=1",
        lambda s: _get("latency", f"{s}_cpu_us_per_request", "stat_us"),
        "–",
    ),
    ("CPU µs per stream, c=1", lambda s: _get("stream_latency", f"{s}_cpu_us_per_request", "stat_us"), "–"),
    ("added latency p50, c=1 (ms)", lambda s: _added("latency", "e2e_ms", s, "p50"), "–"),
    ("added latency p99, c=1 (ms)", lambda s: _added("latency", "e2e_ms", s, "p99"), "–"),
    ("added TTFT p50, c=1 (ms)", lambda s: _added("stream_latency", "ttft_ms", s, "p50"), "–"),
    ("added latency p50, closed loop (ms)", lambda s: _added("throughput", "e2e_ms", s, "p50"), "–"),
    ("added latency p99, closed loop (ms)", lambda s: _added("throughput", "e2e_ms", s, "p99"), "–"),
    (
        "added stream e2e p50, closed loop (ms)",
        lambda s: _added("stream_throughput", "e2e_ms", s, "p50"),
        "–",
    ),
    ("max req/s × direct", lambda s: _rps_ratio("throughput", s), "–"),
)


def render_versus(meta: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """The gateway beside the floor proxy (its own stack, bare) and the reference proxy (aiohttp), same
    run: each figure and the ratios gateway ÷ floor (the gateway's own logic), floor ÷ reference (the
    stack) and gateway ÷ reference (empty without a reference path; the floor's columns "–" in a run
    without it)."""
    if "reference_cpu_us_per_request" not in (result.get("latency") or {}):
        return []
    params = meta.get("params", {})
    lines = [
        "",
        f"Gateway, floor proxy (bench/reference_asgi_proxy.py: uvicorn + ASGI + aiohttp client) and "
        f"reference proxy (bench/reference_proxy.py: aiohttp server + client), same run; closed loop at "
        f"concurrency {params.get('throughput_concurrency')}, streams of {params.get('stream_tokens')} "
        "tokens; closed-loop CPU from schedstat (mean of the blocks), c=1 CPU from /proc stat.",
        "",
        "| figure | gateway | floor | reference | gateway ÷ floor | floor ÷ reference "
        "| gateway ÷ reference | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, reader, target in VERSUS:
        via, floor, ref = (reader(s)(result) for s in ("gateway", "floor", "reference"))
        cells = (via, floor, ref, _over(via, floor), _over(floor, ref), _over(via, ref))
        lines.append(f"| {name} | " + " | ".join(_fmt(c) for c in cells) + f" | {target} |")
    return lines


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.0f}"


def render_overhead(meta: dict[str, Any], result: dict[str, Any]) -> str:
    params = meta.get("params", {})
    delay_ms = params.get("stream_token_delay_ms")
    lines = ["# Gateway overhead", "", f"pinning: {meta.get('pinning')}", ""]
    lines += ["| figure | measured | target | met |", "|---|---|---|---|"]
    for name, read, target, test in CHECKS:
        value = read(result)
        met = "–" if target == "–" or value is None else ("yes" if test(value) else "no")
        lines.append(f"| {name} | {_fmt(value)} | {target} | {met} |")
    lines += render_versus(meta, result)
    lines += ["", "| phase | path | p50 ms | p99 ms | mean ms |", "|---|---|---|---|---|"]
    phases = (
        ("latency", "e2e_ms"),
        ("stream_latency", "ttft_ms"),
        ("stream_latency", "e2e_ms"),
        ("throughput", "e2e_ms"),
        ("stream_throughput", "e2e_ms"),
    )
    for phase, metric in phases:
        entry = (result.get(phase) or {}).get(metric, {})
        for path in ("direct", "gateway", "reference", "floor", "added", "added_reference", "added_floor"):
            dist = entry.get(path)
            if dist:
                label = f"{phase} {metric.removesuffix('_ms')}"
                lines.append(
                    f"| {label} | {path} | {_fmt(dist['p50'])} | {_fmt(dist['p99'])} | {_fmt(dist['mean'])} |"
                )
    streams = [
        StreamLevel(**{k: v for k, v in lv.items() if k not in ("sustained", "frames_per_s")})
        for lv in result.get("streams", [])
    ]
    if streams:
        nominal_ms = delay_ms * params.get("stream_tokens", 0) if delay_ms else None
        lines += [
            "",
            f"Streams: {params.get('stream_tokens')} tokens every {delay_ms} ms (nominal duration "
            f"{_fmt(nominal_ms)} ms); stalled = failed or a gap over {params.get('stall_ms')} ms.",
            "",
        ]
        lines += [
            "| streams | path | ok | stalled | frames/s | nominal tokens/s | stream e2e p50 ms "
            "| max gap p99 ms | gateway CPU µs/stream | CPU gateway / engine / client |"
        ]
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for lv in streams:
            gap = lv.max_gap_ms["p99"] if lv.max_gap_ms else None
            cpu = (lv.cpu_us_per_stream or {}).get("stat_us")
            nominal = f"{lv.streams * 1000 / delay_ms:.0f}" if delay_ms else "–"
            e2e = _fmt(lv.e2e_ms["p50"]) if lv.e2e_ms else "–"
            cells = (
                lv.streams,
                lv.path,
                lv.ok,
                lv.stalled,
                f"{lv.frames_per_s:.0f}",
                nominal,
                e2e,
                _fmt(gap),
                _fmt(cpu),
                " / ".join(
                    f"{lv.cpu_util[k]:.0%}" for k in ("gateway", "engine", "client") if k in lv.cpu_util
                )
                or "–",
            )
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if result.get("profile"):
        lines += ["", render_profile(result["profile"], meta.get("argv", []))]
    return "\n".join(lines) + "\n"


def write_overhead(out: Path, meta: dict[str, Any], result: dict[str, Any]) -> None:
    (out / "overhead.json").write_text(json.dumps({"meta": meta, **result}, indent=2, default=str))
    (out / "report.md").write_text(render_overhead(meta, result))
