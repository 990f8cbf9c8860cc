"""Reports: one JSON file with every run's summary, a markdown table, the raw samples (JSONL, one file per
run) and the plots, all in one directory (default `bench/results/<time>-<command>-<name>/`).
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.fault_report import render_fault_sections
from bench.summary import RunResult

RESULTS_DIR = Path("bench/results")

COLUMNS = (
    ("run", "label"),
    ("load", "level"),
    ("req", "requests"),
    ("ok", "ok"),
    ("rej", "rejected"),
    ("err", "errors"),
    ("TTFT p50/p95/p99 ms", "ttft"),
    ("TPOT p50/p99 ms", "tpot"),
    ("e2e p50/p99 ms", "e2e"),
    ("req/s", "rps"),
    ("tok/s", "tps"),
    ("goodput req/s", "good_rps"),
    ("goodput tok/s", "good_tps"),
    ("goodput req/s/GPU", "good_rps_gpu"),
    ("SLO met", "attainment"),
    ("cache hit", "hit"),
    ("max/mean req", "balance_requests"),
    ("max/mean engine load", "balance_engine"),
)


LEGEND = (
    "Latency columns are over successful requests (ms; simulated time when time_scale ≠ 1). Goodput and "
    "SLO met count requests that met both the TTFT and the TPOT SLO; per GPU: over the engines of the run's "
    "fleet (a disaggregated fleet: prefill + decode). max/mean req: requests per replica "
    "(x-gateway-replica; a disaggregated fleet: its decode engines); max/mean engine load: mean running + "
    "waiting sampled from each engine."
)


def output_dir(command: str, name: str, root: Path | None = None) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
    path = (root or RESULTS_DIR) / f"{time.strftime('%Y%m%d-%H%M%S')}-{command}-{slug}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def environment() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": list(load) if load else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _triple(dist: dict[str, float] | None, keys: Sequence[str]) -> str:
    if dist is None:
        return "–"
    return " / ".join(_fmt(dist[k], 1 if dist[k] < 100 else 0) for k in keys)


def row(result: RunResult) -> dict[str, str]:
    s = result.summary
    engine = s.get("engine") or {}
    hit = engine.get("prefix_cache_hit_ratio")
    return {
        "label": result.label,
        "level": _fmt(result.level, 2) if result.level is not None else "–",
        "requests": str(s["requests"]),
        "ok": str(s["ok"]),
        "rejected": str(s["rejected"]),
        "errors": str(s["errors"]),
        "ttft": _triple(s["ttft_ms"], ("p50", "p95", "p99")),
        "tpot": _triple(s["tpot_ms"], ("p50", "p99")),
        "e2e": _triple(s["e2e_ms"], ("p50", "p99")),
        "rps": _fmt(s["throughput"]["requests_per_s"], 2),
        "tps": _fmt(s["throughput"]["output_tokens_per_s"], 0),
        "good_rps": _fmt(s["goodput"]["requests_per_s"], 2),
        "good_tps": _fmt(s["goodput"]["output_tokens_per_s"], 0),
        "good_rps_gpu": _fmt(s["goodput"]["requests_per_s"] / s["gpus"], 2) if s.get("gpus") else "–",
        "attainment": f"{s['goodput']['attainment_ratio']:.0%}",
        "hit": f"{hit:.0%}" if hit is not None else "–",
        "balance_requests": _fmt(s["replicas"]["max_mean_ratio"], 2),
        "balance_engine": _fmt(engine.get("load_max_mean_ratio"), 2),
    }


def markdown_table(results: Sequence[RunResult]) -> str:
    header = "| " + " | ".join(title for title, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [header, rule]
    for result in results:
        cells = row(result)
        lines.append("| " + " | ".join(cells[key] for _, key in COLUMNS) + " |")
    return "\n".join(lines)


def class_table(results: Sequence[RunResult]) -> str:
    """SLO attainment per priority class (only when some run used classes)."""
    classes = sorted({c for r in results for c in r.summary["per_class"]})
    if classes == ["default"]:
        return ""
    lines = ["| run | load | " + " | ".join(classes) + " |", "|---|---|" + "---|" * len(classes)]
    for r in results:
        cells = []
        for name in classes:
            entry = r.summary["per_class"].get(name)
            cells.append(f"{entry['attainment_ratio']:.0%} of {entry['requests']}" if entry else "–")
        level = _fmt(r.level, 2) if r.level is not None else "–"
        lines.append(f"| {r.label} | {level} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def outcome_lines(results: Sequence[RunResult]) -> list[str]:
    lines = []
    for r in results:
        retried = r.summary.get("retries") or {}
        if retried.get("retried"):
            count, admitted = retried["retried"], retried["admitted"]
            lines.append(
                f"- {r.label} @ {_fmt(r.level, 2)}: {count} retried after their Retry-After, "
                f"{admitted} of them admitted ({admitted / count:.0%})"
            )
        for reason, entry in r.summary["outcomes"].items():
            latency = entry["latency_ms"]
            lines.append(
                f"- {r.label} @ {_fmt(r.level, 2)}: {reason} × {entry['count']} (status "
                f"{', '.join(map(str, entry['status']))}), latency p50/p99 "
                f"{_fmt(latency['p50'], 2)}/{_fmt(latency['p99'], 2)} ms, Retry-After on "
                f"{entry['retry_after_present_ratio']:.0%}" + _gateway_side(r.summary, reason)
            )
    return lines


def _gateway_side(summary: dict[str, Any], reason: str) -> str:
    """The gateway's own timing of these rejections (its histogram over the window), when scraped."""
    entry = ((summary.get("engine") or {}).get("gateway_rejections") or {}).get(reason)
    if not entry:
        return ""
    within = entry["within_5ms_ratio"]
    p50, p99 = _fmt(entry["p50_ms"], 2), _fmt(entry["p99_ms"], 2)
    share = "–" if within is None else f"{within:.1%}"
    return f"; gateway-side × {entry['count']}: p50/p99 {p50}/{p99} ms, {share} within 5 ms"


def instance_lines(results: Sequence[RunResult]) -> list[str]:
    """Requests each gateway instance counted (its /metrics), for runs with several instances."""
    lines = []
    for r in results:
        counts = (r.summary.get("engine") or {}).get("gateway_instances") or {}
        if len(counts) > 1:
            shown = ", ".join(f"{url.split('://', 1)[-1]} {_fmt(n)}" for url, n in counts.items())
            lines.append(f"- {r.label} @ {_fmt(r.level, 2)}: {shown}")
    return lines


def render_markdown(title: str, meta: dict[str, Any], results: Sequence[RunResult], lead: str = "") -> str:
    """The report: `# title`, then `lead` (a command's own sections), the parameters and the tables."""
    params = meta.get("params", {})
    parts = [f"# {title}", ""]
    if lead:
        parts += [lead.rstrip("\n"), ""]
    parts += [f"- {key}: `{json.dumps(value, default=str)}`" for key, value in params.items()]
    parts += ["", LEGEND, ""]
    parts += [markdown_table(results), ""]
    classes = class_table(results)
    if classes:
        parts += ["SLO attainment per priority class:", "", classes, ""]
    warned = [
        f"- {r.label} @ {_fmt(r.level, 2)}: {w}" for r in results for w in r.summary.get("warnings", [])
    ]
    if warned:
        parts += ["Warnings:", "", *warned, ""]
    instances = instance_lines(results)
    if instances:
        parts += ["Requests per gateway instance (measured window, its own counter):", "", *instances, ""]
    outcome = outcome_lines(results)
    if outcome:
        parts += ["Failed and rejected requests:", "", *outcome, ""]
    parts += render_fault_sections(results)
    return "\n".join(parts)


def report_json(
    meta: dict[str, Any], results: Sequence[RunResult], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`{meta, runs: [every run's summary]}` plus the keys of `extra` (a command's own sections)."""
    return {
        "meta": meta,
        "runs": [
            {"label": r.label, "level": r.level, "level_kind": r.level_kind, "params": r.params, **r.summary}
            for r in results
        ],
        **(extra or {}),
    }


def write_report(
    out: Path,
    title: str,
    meta: dict[str, Any],
    results: Sequence[RunResult],
    plots: bool = True,
    *,
    lead: str = "",
    extra: dict[str, Any] | None = None,
) -> list[Path]:
    """Write report.json, report.md, samples-*.jsonl and (when matplotlib is there) the PNG plots;
    `lead` goes under the markdown's title, `extra`'s keys into the JSON."""
    written = []
    json_path = out / "report.json"
    json_path.write_text(json.dumps(report_json(meta, results, extra), indent=2, default=str))
    md_path = out / "report.md"
    md_path.write_text(render_markdown(title, meta, results, lead))
    written += [json_path, md_path]
    for i, r in enumerate(results):
        path = out / f"samples-{i:02d}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', r.label)}.jsonl"
        path.write_text("".join(json.dumps(s.to_json()) + "\n" for s in r.samples))
        written.append(path)
    if plots:
        from bench.plots import write_plots

        written += write_plots(out, results)
    return written
