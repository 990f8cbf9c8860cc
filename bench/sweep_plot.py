"""`sweep.png`: `bench sweep`'s picture, two panels against offered load (req/s), one line per entry
(the mean over rounds at each rate, each round's run a faint dot):

- SLO goodput, with horizontal lines at the knee's goodput and 0.9× it, and a vertical one at the knee;
- refusals, % of requests: every refusal (solid) and, when there were any, those after waiting in the
  queue (`queue_timeout`, dotted).

Without matplotlib nothing is written (`bench.plots.pyplot`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.plots import pyplot
from bench.sweep_report import SweepRow

TARGET_SHARE = 0.9
"""The second horizontal line: this share of the knee's goodput."""

FILE_NAME = "sweep.png"


def _by_entry(rows: Sequence[SweepRow]) -> dict[str, dict[float, list[SweepRow]]]:
    """entry (without its round) → offered rate → its runs, in the order the entries first appear."""
    grouped: dict[str, dict[float, list[SweepRow]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        grouped[row.base_entry][row.offered_rps].append(row)
    return grouped


def _mean(rows: Sequence[SweepRow], value: Callable[[SweepRow], float]) -> float:
    return sum(value(r) for r in rows) / len(rows)


def write_sweep_plot(
    out: Path, rows: Sequence[SweepRow], knee: float, knee_goodput_rps: float | None
) -> Path | None:
    """Write `out/sweep.png` (module docstring); None when matplotlib is missing or there are no rows."""
    plt = pyplot()
    if plt is None or not rows:
        return None
    fig, (good_ax, refused_ax) = plt.subplots(1, 2, figsize=(13, 4.8))
    for entry, by_rate in _by_entry(rows).items():
        rates = sorted(by_rate)
        (line,) = good_ax.plot(
            rates, [_mean(by_rate[x], lambda r: r.goodput_rps) for x in rates], marker="o", label=entry
        )
        color = line.get_color()
        runs = [r for x in rates for r in by_rate[x]]
        if len(runs) > len(rates):
            good_ax.scatter(
                [r.offered_rps for r in runs], [r.goodput_rps for r in runs], color=color, alpha=0.3, s=12
            )
        refused_ax.plot(
            rates,
            [100 * _mean(by_rate[x], lambda r: r.refused_ratio) for x in rates],
            marker="o",
            color=color,
            label=f"{entry}: refused",
        )
        if any(r.refused_after_waiting_ratio > 0 for r in runs):
            refused_ax.plot(
                rates,
                [100 * _mean(by_rate[x], lambda r: r.refused_after_waiting_ratio) for x in rates],
                linestyle=":",
                color=color,
                label=f"{entry}: after waiting",
            )
    if knee_goodput_rps:
        good_ax.axhline(knee_goodput_rps, color="grey", linestyle="--", linewidth=1, label="knee's goodput")
        good_ax.axhline(
            TARGET_SHARE * knee_goodput_rps,
            color="grey",
            linestyle=":",
            linewidth=1,
            label=f"{TARGET_SHARE:g}× knee's goodput",
        )
    for ax in (good_ax, refused_ax):
        ax.axvline(knee, color="black", alpha=0.3, linewidth=1)
        ax.set_xlabel("offered load (req/s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    good_ax.set_ylabel("SLO goodput (req/s)")
    good_ax.set_title(f"SLO goodput vs offered load (knee {knee:.2f} req/s)")
    good_ax.set_ylim(bottom=0)
    refused_ax.set_ylabel("% of requests")
    refused_ax.set_title("refused vs offered load")
    refused_ax.set_ylim(0, 100)
    path = out / FILE_NAME
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
