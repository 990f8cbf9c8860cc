"""`python -m bench.overhead_runs DIR...`: several `bench overhead` runs (each DIR holds its
overhead.json) summarized side by side: per figure of the gateway/floor/reference table
(bench/overhead_report.py, `VERSUS`) each server's value and each ratio as the median of the runs
[smallest–largest]. A ratio is taken within each run first, then summarized (the runs' machine noise
does not cancel across runs). A figure a run lacks (a run without the floor proxy) is left out of that
cell; a cell no run has is "–".
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.overhead_report import VERSUS

SERVERS = ("gateway", "floor", "reference")
RATIOS = (("gateway", "floor"), ("floor", "reference"), ("gateway", "reference"))


def _cell(values: list[float]) -> str:
    if not values:
        return "–"
    digits = 2 if max(abs(v) for v in values) < 10 else 0
    med, low, high = statistics.median(values), min(values), max(values)
    return f"{med:.{digits}f} [{low:.{digits}f}–{high:.{digits}f}]"


def summarize(results: list[dict[str, Any]]) -> str:
    """The markdown table (module docstring) over the runs' results."""
    head = [*SERVERS, *(f"{a} ÷ {b}" for a, b in RATIOS)]
    lines = [
        f"runs: {len(results)}; median [smallest–largest]",
        "",
        "| figure | " + " | ".join(head) + " |",
        "|---|" + "---|" * len(head),
    ]
    for name, reader, _target in VERSUS:
        per_run = [{s: reader(s)(r) for s in SERVERS} for r in results]
        cells = [_cell([v for run in per_run if (v := run[s]) is not None]) for s in SERVERS]
        for a, b in RATIOS:
            cells.append(_cell([x / y for run in per_run if (x := run[a]) is not None and (y := run[b])]))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead_runs", description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path, help="output directories of `bench overhead`")
    args = parser.parse_args(argv)
    print(summarize([json.loads((d / "overhead.json").read_text()) for d in args.dirs]), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
