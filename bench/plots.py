"""PNG plots (matplotlib, Agg backend): latency CDFs, goodput vs offered load, per-replica load over time.
Without matplotlib (`pip install 'llm-gateway[bench]'`) no plot is written and the report says so.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.summary import RunResult

MAX_LOAD_PANELS = 12


def pyplot() -> Any | None:
    """matplotlib.pyplot on the Agg backend, or None (and a note on stderr) when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib is not installed; no plots written", file=sys.stderr)
        return None
    return plt


def write_plots(out: Path, results: Sequence[RunResult]) -> list[Path]:
    plt = pyplot()
    if plt is None or not results:
        return []
    written = [latency_cdfs(plt, out, results)]
    if len({r.level for r in results}) > 1:
        written.append(goodput_vs_load(plt, out, results))
    if any(r.series is not None and r.series.points for r in results):
        written.append(replica_load(plt, out, results))
    return written


def _name(r: RunResult) -> str:
    return r.label if r.level is None else f"{r.label} @ {r.level:g}"


def latency_cdfs(plt: Any, out: Path, results: Sequence[RunResult]) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("end-to-end", "e2e_s"))
    for ax, (title, attr) in zip(axes, panels, strict=True):
        low, high = float("inf"), 0.0
        for r in results:
            values = sorted(
                getattr(s, attr) * 1000 for s in r.measured if s.ok and getattr(s, attr) is not None
            )
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=_name(r))
                low, high = min(low, values[0]), max(high, values[-1])
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("ms")
        if low > 0 and high / low > 50:
            ax.set_xscale("log")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize="small")
    path = out / "latency_cdf.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def goodput_vs_load(plt: Any, out: Path, results: Sequence[RunResult]) -> Path:
    by_label: dict[str, list[RunResult]] = defaultdict(list)
    for r in results:
        if r.level is not None:
            by_label[r.label].append(r)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, runs in by_label.items():
        runs.sort(key=lambda r: r.level or 0.0)
        xs = [r.level for r in runs]
        ax.plot(
            xs, [r.summary["goodput"]["requests_per_s"] for r in runs], marker="o", label=f"{label} goodput"
        )
        ax.plot(
            xs,
            [r.summary["throughput"]["requests_per_s"] for r in runs],
            linestyle="--",
            alpha=0.5,
            label=f"{label} throughput",
        )
    kind = results[0].level_kind
    ax.set_xlabel("offered load (req/s)" if kind == "rate" else f"offered load ({kind})")
    ax.set_ylabel("req/s")
    ax.set_title("goodput (both SLOs met) vs offered load")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    path = out / "goodput_vs_load.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def replica_load(plt: Any, out: Path, results: Sequence[RunResult]) -> Path:
    panels = [r for r in results if r.series is not None and r.series.points][:MAX_LOAD_PANELS]
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False, sharey=True)
    for ax, r in zip(axes.flat, panels, strict=False):
        assert r.series is not None
        by_replica: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for t_s, replica, snap in r.series.points:
            by_replica[replica].append((t_s, snap.load))
        for replica, points in sorted(by_replica.items()):
            ax.plot([p[0] for p in points], [p[1] for p in points], label=replica, linewidth=1)
        ax.set_title(_name(r), fontsize="small")
        ax.set_xlabel("s")
        ax.set_ylabel("running + waiting")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize="x-small")
    path = out / "replica_load.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
