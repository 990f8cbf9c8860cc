"""`bench sweep`'s command: its entries, levels, checks and probe windows, and the whole command over a
fake fleet (`run_on_fleet` replaced: no process is started)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench import cli, commands, sweep
from bench.summary import RunResult
from tests.unit.bench.sweep_runs import canned_run


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(["sweep", *argv])


def test_entries_are_defaults_then_no_admission_then_the_variants() -> None:
    args = parse(
        "--policy",
        "prefix-affinity",
        "--pool-set",
        "retries.max_attempts=1",
        "--variant",
        "cap:max_concurrency_per_replica=8",
    )
    entries, overrides = sweep.sweep_entries(args)
    assert [e[0] for e in entries] == ["defaults", "no-admission", "cap"]
    assert overrides == {
        "defaults": [],
        "no-admission": ["latency_model.adaptive_cap=false", "max_concurrency_per_replica=null"],
        "cap": ["max_concurrency_per_replica=8"],
    }
    defaults, no_admission, cap = (e[1] for e in entries)
    assert defaults is not None and no_admission is not None and cap is not None
    assert {g.policy for g in (defaults, no_admission, cap)} == {"prefix-affinity"}
    assert "latency_model" not in defaults.pool_overrides and defaults.pool_overrides["retries"] == {
        "max_attempts": 1
    }
    assert no_admission.pool_overrides["latency_model"] == {"adaptive_cap": False}
    assert no_admission.pool_overrides["max_concurrency_per_replica"] is None
    assert no_admission.pool_overrides["retries"] == {"max_attempts": 1}, "--pool-set applies to every entry"
    assert cap.pool_overrides["max_concurrency_per_replica"] == 8
    with pytest.raises(ValueError, match="distinct labels"):
        sweep.sweep_entries(parse("--variant", "defaults:policy=round-robin"))


def test_no_admission_overrides_a_template_cap(tmp_path: Path) -> None:
    """A `--gateway-config` with a cap of its own: no-admission sets it back to none."""
    from bench.fleet_config import gateway_config

    template = tmp_path / "gw.yaml"
    template.write_text(
        "pools: [{model: bench-model, replicas: {static: []}, max_concurrency_per_replica: 16}]\n"
    )
    entries, _ = sweep.sweep_entries(parse("--gateway-config", str(template)))
    pools = {
        label: gateway_config(g, "bench-model", ["http://e:1"], 8080)["pools"][0]
        for label, g, _ in entries
        if g
    }
    assert pools["defaults"]["max_concurrency_per_replica"] == 16
    assert pools["no-admission"]["max_concurrency_per_replica"] is None
    assert pools["no-admission"]["latency_model"] == {"adaptive_cap": False}


def test_levels_are_multiples_of_the_knee_ascending_once() -> None:
    assert sweep.level_rates([2, 0.5, 1, 1.0], 12.0) == [6.0, 12.0, 24.0]
    assert parse().levels == [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--rate", "4"], "not --rate"),
        (["--arrival", "closed"], "offers rates"),
        (["--disagg", "1:1"], "drop --disagg"),
        (["--rounds", "0"], "--rounds"),
        (["--levels", "0", "1"], "--levels"),
        (["--knee", "-1"], "--knee"),
    ],
)
def test_options_a_sweep_cannot_take(argv: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sweep.check(parse(*argv))


def test_a_probe_runs_half_the_measured_window_or_its_own() -> None:
    from bench import options

    def load(*argv: str) -> Any:
        args = parse(*argv)
        return sweep.probe_experiment(options.experiment(args, local=True), args.knee_duration_s).load

    by_count = load("--requests", "105", "--warmup-requests", "5")
    assert (by_count.requests, by_count.duration_s, by_count.warmup_requests) == (55, None, 5)
    by_time = load("--duration-s", "60", "--warmup-s", "10")
    assert (by_time.requests, by_time.duration_s, by_time.warmup_s) == (None, 35.0, 10.0)
    own = load("--duration-s", "60", "--knee-duration-s", "12")
    assert (own.requests, own.duration_s) == (None, 12.0)


def test_the_command_line_is_the_sweeps_own_arguments() -> None:
    args = parse("--replicas", "4", "--pool-set", "slo={ttft_s: 1}")
    assert args.command_argv == ["--replicas", "4", "--pool-set", "slo={ttft_s: 1}"]
    assert (
        sweep.command_line(args.command_argv)
        == "llm-gateway bench sweep --replicas 4 --pool-set 'slo={ttft_s: 1}'"
    )
    assert sweep.command_line(["--replicas", "4"], 12.5) == "llm-gateway bench sweep --replicas 4 --knee 12.5"


@dataclass
class FakeFleet:
    """Every run meets the SLO up to `capacity` req/s; past it only capacity ÷ rate of the requests
    do, and `defaults` refuses the rest at arrival. Records (label, rate, duration, pool overrides)."""

    capacity: float
    calls: list[tuple[str, float, float | None, dict[str, Any]]]

    def __call__(
        self,
        args: argparse.Namespace,
        *,
        label: str,
        gateway: Any,
        oracle: bool,
        level: float,
        exp: Any,
        log_dir: Path,
    ) -> RunResult:
        self.calls.append((label, level, exp.load.duration_s, dict(gateway.pool_overrides)))
        met = round(100 * min(1.0, self.capacity / level))
        if label.startswith("defaults"):
            return canned_run(label, level, met=met, at_arrival=100 - met)
        return canned_run(label, level, met=met, missed=100 - met)


def fake_fleet(monkeypatch: pytest.MonkeyPatch, capacity: float) -> FakeFleet:
    fleet = FakeFleet(capacity, [])
    monkeypatch.setattr(sweep, "run_on_fleet", fleet)
    monkeypatch.setattr(commands, "run_on_fleet", fleet)
    return fleet


def test_the_sweep_finds_the_knee_then_runs_every_entry_at_every_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = fake_fleet(monkeypatch, capacity=30.0)
    argv = [
        "sweep",
        "--knee-start",
        "8",
        "--levels",
        "1",
        "2",
        "--duration-s",
        "20",
        "--out",
        str(tmp_path),
        "--quiet",
    ]
    assert cli.main(argv) == 0
    probes = [c for c in fleet.calls if c[2] == 10.0]
    assert [c[1] for c in probes] == [8.0, 16.0, 32.0, 24.0, 28.0, 30.0], "doubling, then bisection"
    assert {c[0] for c in probes} == {"no-admission"} and all("latency_model" in c[3] for c in probes)
    runs = [(c[0], c[1], c[2]) for c in fleet.calls[len(probes) :]]
    assert runs == [
        ("defaults", 30.0, 20.0),
        ("no-admission", 30.0, 20.0),
        ("defaults", 60.0, 20.0),
        ("no-admission", 60.0, 20.0),
    ]
    report = json.loads((tmp_path / "report.json").read_text())
    section = report["sweep"]
    assert section["knee"]["rate"] == 30.0 and len(section["knee"]["probes"]) == 6
    assert section["knee_goodput_rps"] == pytest.approx(10.0)
    at_2x = {r["entry"]: r for r in section["rows"] if r["level"] == 2.0}
    assert at_2x["defaults"]["refused_at_arrival_ratio"] == pytest.approx(0.5)
    assert at_2x["defaults"]["admitted_within_slo_ratio"] == 1.0
    assert at_2x["no-admission"]["refused_ratio"] == 0.0 and at_2x["no-admission"][
        "goodput_vs_knee"
    ] == pytest.approx(0.5)
    text = (tmp_path / "report.md").read_text()
    assert text.startswith(
        "# bench sweep: shared-prefix\n\nReproduce: `llm-gateway bench sweep --knee-start 8"
    )
    assert "--quiet --knee 30`" in text and "## Load sweep" in text and "## Every run" in text
    assert "bench sweep: knee probe (bisect) at 30.00 req/s: 100.0% within the SLO" in capsys.readouterr().err
    if (tmp_path / "latency_cdf.png").exists():
        assert (tmp_path / "sweep.png").exists(), "with matplotlib, the sweep's picture too"


def test_a_given_knee_skips_the_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = fake_fleet(monkeypatch, capacity=30.0)
    argv = [
        "sweep",
        "--knee",
        "20",
        "--levels",
        "0.5",
        "--rounds",
        "2",
        "--out",
        str(tmp_path),
        "--quiet",
        "--no-plots",
    ]
    assert cli.main(argv) == 0
    assert [(c[0], c[1], c[2]) for c in fleet.calls] == [
        ("defaults #1", 10.0, 60.0),
        ("no-admission #1", 10.0, 60.0),
        ("no-admission #2", 10.0, 60.0),
        ("defaults #2", 10.0, 60.0),
    ], "no probe; the default window is 60 s; the second round rotates the order"
    section = json.loads((tmp_path / "report.json").read_text())["sweep"]
    assert section["knee"]["found_by"] == "--knee" and section["knee_goodput_rps"] is None, "no 1× level"
    assert [r["entry"] for r in section["rows"]] == [
        "defaults #1",
        "defaults #2",
        "no-admission #1",
        "no-admission #2",
    ]
    assert not (tmp_path / "sweep.png").exists()


def test_no_knee_no_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = fake_fleet(monkeypatch, capacity=0.001)
    argv = ["sweep", "--knee-start", "4", "--duration-s", "20", "--out", str(tmp_path), "--quiet"]
    assert cli.main(argv) == 1
    assert len(fleet.calls) == 9 and fleet.calls[-1][1] == 4.0 / 256, "halved down to 256× below the start"
    assert "no knee, no sweep" in capsys.readouterr().err
    assert not (tmp_path / "report.json").exists()
