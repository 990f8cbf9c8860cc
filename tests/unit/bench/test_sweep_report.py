"""`bench sweep`'s report from canned runs: the rows against the knee, the knee's goodput, the table,
the JSON section and the plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import sweep_plot
from bench.knee import KneeSearch, Probe
from bench.summary import RunResult
from bench.sweep_plot import write_sweep_plot
from bench.sweep_report import (
    knee_goodput,
    knee_lines,
    probe_table,
    render_lead,
    sweep_json,
    sweep_row,
    sweep_rows,
    sweep_table,
)
from tests.unit.bench.sweep_runs import canned_run


def runs() -> list[RunResult]:
    return [
        canned_run("no-admission #1", 10.0, met=100),  # 10 req/s within the SLO
        canned_run("no-admission #2", 10.0, met=80, missed=20),  # 8 req/s
        canned_run("defaults", 20.0, met=90, missed=10, at_arrival=60, after_waiting=40, hit=0.83),
        canned_run("no-admission #1", 20.0, met=0, missed=200),
    ]


def test_the_knees_goodput_is_the_mean_of_the_reference_at_1x_else_the_probe() -> None:
    assert knee_goodput(runs(), 10.0, "no-admission") == pytest.approx(9.0)
    assert knee_goodput(runs(), 10.0, "defaults", probe_goodput=7.5) == 7.5, "defaults has no 1× run"
    assert knee_goodput(runs()[2:], 10.0, "no-admission") is None


def test_a_row_splits_refusals_and_judges_the_admitted() -> None:
    row = sweep_row(runs()[2], knee=10.0, knee_goodput_rps=9.0)
    assert (row.level, row.offered_rps, row.entry, row.requests) == (2.0, 20.0, "defaults", 200)
    assert row.goodput_rps == pytest.approx(9.0) and row.goodput_vs_knee == pytest.approx(1.0)
    assert row.refused_ratio == pytest.approx(0.5)
    assert row.refused_at_arrival_ratio == pytest.approx(0.3), "queue_full: refused at arrival"
    assert row.refused_after_waiting_ratio == pytest.approx(0.2), "queue_timeout: after waiting"
    assert row.admitted_within_slo_ratio == pytest.approx(0.9), "90 of the 100 admitted met the SLO"
    assert row.ttft_p95_ms == pytest.approx(5000.0) and row.tpot_p99_ms is None
    assert row.cache_hit_ratio == 0.83


def test_a_row_without_admitted_requests_or_reference() -> None:
    refused = canned_run("defaults", 30.0, met=0, at_arrival=10)
    row = sweep_row(refused, knee=10.0, knee_goodput_rps=None)
    assert row.admitted_within_slo_ratio is None and row.goodput_vs_knee is None
    assert row.refused_ratio == 1.0 and row.cache_hit_ratio is None
    assert row.base_entry == "defaults" and sweep_row(runs()[1], 10.0, 9.0).base_entry == "no-admission"


def test_the_table_has_one_row_per_run() -> None:
    table = sweep_table(sweep_rows(runs(), 10.0, 9.0)).splitlines()
    assert table[0].startswith("| level ×knee | offered req/s | entry | SLO goodput req/s | ÷ knee's goodput")
    assert len(table) == 2 + 4
    assert (
        table[2]
        == "| 1.00 | 10.00 | no-admission #1 | 10.00 | 1.11 | 0.0% | 0.0% | 0.0% | 100.0% | 100 | – | – |"
    )
    assert (
        table[4]
        == "| 2.00 | 20.00 | defaults | 9.00 | 1.00 | 50.0% | 30.0% | 20.0% | 90.0% | 5000 | – | 83% |"
    )


def search() -> KneeSearch:
    probes = (
        Probe(8.0, 1.0, True, "start"),
        Probe(16.0, 0.5, False, "double"),
        Probe(12.0, 0.97, True, "bisect"),
    )
    return KneeSearch(12.0, probes, "bisected")


def test_the_lead_names_the_command_the_knee_and_its_probes() -> None:
    rows = sweep_rows(runs(), 12.0, 9.0)
    lead = render_lead(
        command="llm-gateway bench sweep --replicas 4",
        command_with_knee="llm-gateway bench sweep --replicas 4 --knee 12",
        knee_text=knee_lines(12.0, search(), slo_ratio=0.95, precision=0.1, reference="no-admission"),
        probes=probe_table(search(), {8.0: 7.9, 12.0: 11.4}),
        rows=rows,
        entries={"defaults": [], "no-admission": ["latency_model.adaptive_cap=false"]},
        reference="no-admission",
    )
    assert lead.startswith("Reproduce: `llm-gateway bench sweep --replicas 4`")
    assert "without the knee search: `llm-gateway bench sweep --replicas 4 --knee 12`" in lead
    assert "**Knee: 12.00 req/s** — the highest offered rate at which ≥ 95% of the requests" in lead
    assert "3 probes, bracketed by doubling or halving, then bisected to 10%" in lead
    assert "| 2 | double | 16.00 | 50.0% | – | misses |" in lead
    assert "| 3 | bisect | 12.00 | 97.0% | 11.40 | meets |" in lead
    assert "- defaults: the pool as configured" in lead
    assert "- no-admission: `latency_model.adaptive_cap=false`" in lead
    assert sweep_table(rows) in lead
    given = knee_lines(12.0, None, slo_ratio=0.95, precision=0.1, reference="no-admission")
    assert given == ["**Knee: 12.00 req/s**, given with `--knee` (no search)."]


def test_the_json_section() -> None:
    rows = sweep_rows(runs(), 10.0, 9.0)
    data = sweep_json(
        command="c",
        knee=12.0,
        search=search(),
        goodput_by_rate={8.0: 7.9},
        knee_goodput_rps=9.0,
        rows=rows,
        entries={"defaults": []},
        settings={"slo_ratio": 0.95},
    )
    assert data["knee"]["rate"] == 12.0 and data["knee"]["found_by"] == "search"
    assert data["knee"]["ended"] == "bisected" and data["knee"]["slo_ratio"] == 0.95
    first = data["knee"]["probes"][0]
    assert first == {"rate": 8.0, "met_ratio": 1.0, "meets": True, "step": "start", "goodput_rps": 7.9}
    assert data["knee"]["probes"][1]["goodput_rps"] is None
    assert len(data["rows"]) == 4 and data["rows"][2]["refused_after_waiting_ratio"] == pytest.approx(0.2)
    given = sweep_json(
        command="c",
        knee=5.0,
        search=None,
        goodput_by_rate={},
        knee_goodput_rps=None,
        rows=[],
        entries={},
        settings={},
    )
    assert given["knee"] == {"rate": 5.0, "found_by": "--knee", "probes": []}


def test_the_plot_is_written_when_matplotlib_is_there(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = write_sweep_plot(tmp_path, sweep_rows(runs(), 10.0, 9.0), 10.0, 9.0)
    assert path == tmp_path / "sweep.png" and path.stat().st_size > 0
    assert write_sweep_plot(tmp_path, [], 10.0, 9.0) is None, "nothing to draw"


def test_no_plot_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep_plot, "pyplot", lambda: None)
    assert write_sweep_plot(tmp_path, sweep_rows(runs(), 10.0, 9.0), 10.0, 9.0) is None
    assert not (tmp_path / "sweep.png").exists()
