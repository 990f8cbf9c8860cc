"""`bench sweep`'s own report: one row per run against the knee, the knee's probes, and the markdown
that goes at the top of report.md (the JSON gets the same under `sweep`).

Rules of the columns (a run's summary, `bench.summary`):
- level ×knee = offered rate ÷ knee; goodput ÷ knee's = the run's SLO goodput ÷ the knee's goodput,
  which is the mean SLO goodput of the reference entry's runs (no admission) at 1× the knee, or, when
  the sweep has no 1× level, the goodput of the knee search's probe at the knee (None: neither);
- refused = 429/503 answers ÷ requests; "after waiting" are the `queue_timeout` ones (the request
  waited out its class's limit in the gateway's queue), "at arrival" every other refusal;
- admitted within SLO = requests that met the SLO ÷ requests not refused (None when all were refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.knee import KneeSearch
from bench.summary import RunResult

AFTER_WAITING = "queue_timeout"
COLUMNS = (
    "level ×knee",
    "offered req/s",
    "entry",
    "SLO goodput req/s",
    "÷ knee's goodput",
    "refused",
    "at arrival",
    "after waiting",
    "admitted within SLO",
    "TTFT p95 ms",
    "TPOT p99 ms",
    "cache hit",
)
LEGEND = (
    "Goodput counts requests that met both the TTFT and the TPOT objective, per second of the measured "
    "window. ÷ knee's goodput: against the mean goodput of {reference} at 1× the knee (without a 1× "
    "level: the knee's probe). Refused: 429/503 answers ÷ requests, at arrival (every reason but "
    "`queue_timeout`) and after waiting in the gateway's queue (`queue_timeout`). Admitted within SLO: "
    "met the SLO ÷ not refused. Latencies over successful requests (simulated ms when time_scale ≠ 1)."
)


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One run of the sweep, as the table and the plot show it (ratios in [0, 1])."""

    level: float
    offered_rps: float
    entry: str
    goodput_rps: float
    goodput_vs_knee: float | None
    requests: int
    refused_ratio: float
    refused_at_arrival_ratio: float
    refused_after_waiting_ratio: float
    admitted_within_slo_ratio: float | None
    ttft_p95_ms: float | None
    tpot_p99_ms: float | None
    cache_hit_ratio: float | None

    @property
    def base_entry(self) -> str:
        """The entry without its round (`defaults #2` → `defaults`)."""
        return self.entry.split(" #")[0]


def _at(results: Sequence[RunResult], rate: float) -> list[RunResult]:
    return [r for r in results if r.level is not None and abs(r.level - rate) <= 1e-9 * rate]


def knee_goodput(
    results: Sequence[RunResult], knee: float, reference: str, probe_goodput: float | None = None
) -> float | None:
    """The knee's SLO goodput (module docstring): the mean of `reference`'s runs at `knee`, else
    `probe_goodput`."""
    runs = [r for r in _at(results, knee) if r.label.split(" #")[0] == reference]
    if runs:
        return sum(float(r.summary["goodput"]["requests_per_s"]) for r in runs) / len(runs)
    return probe_goodput


def sweep_row(result: RunResult, knee: float, knee_goodput_rps: float | None) -> SweepRow:
    """The row of one run (module docstring)."""
    s = result.summary
    offered = float(result.level or 0.0)
    requests = int(s["requests"])
    refused = int(s["rejected"])
    after_waiting = int((s["outcomes"].get(AFTER_WAITING) or {}).get("count", 0))
    met = int(s["goodput"]["requests"])
    good = float(s["goodput"]["requests_per_s"])
    admitted = requests - refused
    ttft, tpot = s.get("ttft_ms"), s.get("tpot_ms")
    return SweepRow(
        level=offered / knee,
        offered_rps=offered,
        entry=result.label,
        goodput_rps=good,
        goodput_vs_knee=good / knee_goodput_rps if knee_goodput_rps else None,
        requests=requests,
        refused_ratio=refused / requests if requests else 0.0,
        refused_at_arrival_ratio=(refused - after_waiting) / requests if requests else 0.0,
        refused_after_waiting_ratio=after_waiting / requests if requests else 0.0,
        admitted_within_slo_ratio=met / admitted if admitted else None,
        ttft_p95_ms=ttft["p95"] if ttft else None,
        tpot_p99_ms=tpot["p99"] if tpot else None,
        cache_hit_ratio=(s.get("engine") or {}).get("prefix_cache_hit_ratio"),
    )


def sweep_rows(results: Sequence[RunResult], knee: float, knee_goodput_rps: float | None) -> list[SweepRow]:
    return [sweep_row(r, knee, knee_goodput_rps) for r in results]


def _num(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _share(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}%}"


def sweep_table(rows: Sequence[SweepRow]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = (
            f"{r.level:.2f}",
            f"{r.offered_rps:.2f}",
            r.entry,
            f"{r.goodput_rps:.2f}",
            _num(r.goodput_vs_knee, 2),
            _share(r.refused_ratio),
            _share(r.refused_at_arrival_ratio),
            _share(r.refused_after_waiting_ratio),
            _share(r.admitted_within_slo_ratio),
            _num(r.ttft_p95_ms, 0),
            _num(r.tpot_p99_ms, 1),
            _share(r.cache_hit_ratio, 0),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def probe_table(search: KneeSearch, goodput_by_rate: dict[float, float]) -> str:
    lines = ["| probe | step | offered req/s | SLO met | goodput req/s | |", "|---|---|---|---|---|---|"]
    for i, p in enumerate(search.probes, 1):
        good = goodput_by_rate.get(p.rate)
        verdict = "meets" if p.meets else "misses"
        lines.append(f"| {i} | {p.step} | {p.rate:.2f} | {p.met_ratio:.1%} | {_num(good, 2)} | {verdict} |")
    return "\n".join(lines)


def knee_lines(
    knee: float, search: KneeSearch | None, *, slo_ratio: float, precision: float, reference: str
) -> list[str]:
    """How the knee was set, in a sentence or two."""
    if search is None:
        return [f"**Knee: {knee:.2f} req/s**, given with `--knee` (no search)."]
    rule = f"the highest offered rate at which ≥ {slo_ratio:.0%} of the requests met the SLO with {reference}"
    how = {
        "bisected": f"bracketed by doubling or halving, then bisected to {precision:.0%}",
        "max_rate": "the search's highest rate (`--knee-max`): the ratio held at every probed rate, so "
        "the fleet's own knee is at or above it",
    }.get(search.ended, search.ended)
    return [f"**Knee: {knee:.2f} req/s** — {rule}; {len(search.probes)} probes, {how}."]


def render_lead(
    *,
    command: str,
    command_with_knee: str | None,
    knee_text: Sequence[str],
    probes: str,
    rows: Sequence[SweepRow],
    entries: dict[str, list[str]],
    reference: str,
) -> str:
    """The markdown at the top of report.md: the command, the knee (and its probes), the sweep table."""
    parts = [f"Reproduce: `{command}`", ""]
    if command_with_knee:
        parts += [f"The same sweep without the knee search: `{command_with_knee}`", ""]
    parts += [*knee_text, ""]
    if probes:
        parts += ["Knee probes (no admission, a fresh fleet each, a shorter window):", "", probes, ""]
    parts += ["Entries:", ""]
    parts += [
        f"- {label}: " + ("; ".join(f"`{o}`" for o in items) or "the pool as configured")
        for label, items in entries.items()
    ]
    parts += ["", "## Load sweep", "", sweep_table(rows), "", LEGEND.format(reference=reference), ""]
    parts += ["Plot: `sweep.png` (SLO goodput and refusals against offered load).", "", "## Every run"]
    return "\n".join(parts)


def sweep_json(
    *,
    command: str,
    knee: float,
    search: KneeSearch | None,
    goodput_by_rate: dict[float, float],
    knee_goodput_rps: float | None,
    rows: Sequence[SweepRow],
    entries: dict[str, list[str]],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The `sweep` section of report.json."""
    probes = [
        {**asdict(p), "goodput_rps": goodput_by_rate.get(p.rate)} for p in (search.probes if search else ())
    ]
    return {
        "command": command,
        "knee": {
            "rate": knee,
            "found_by": "search" if search is not None else "--knee",
            **({"ended": search.ended} if search is not None else {}),
            "probes": probes,
            **settings,
        },
        "knee_goodput_rps": knee_goodput_rps,
        "entries": entries,
        "rows": [{**asdict(r)} for r in rows],
    }
