"""`llm-gateway plan` through the two functions the gateway's CLI calls: table, JSON, errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from capacity import cli

from .conftest import WORKED_EXAMPLE_PATH


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llm-gateway plan")
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


def test_table_shows_the_worked_example_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--config", str(WORKED_EXAMPLE_PATH)]) == 0
    out = capsys.readouterr().out
    for line in (
        "KV bytes per token kv_tok      163,840 B",
        "KV tokens                      268,554",
        "B_max                          64",
        "W (time in system)             4.50 s",
        "L (Little's law)               90.0 requests",
        "Throughput N_thr               2  (1.38)",
        "Latency N_lat                  2  (1.41)",
        "Memory N_mem                   1  (0.27)",
        "N_base                         2                      binding barrier: latency",
        "N with headroom                3",
        "rho at N_base = 2              0.69",
        "Backlog                        444,960 tokens         ≈ 1,483 requests of 300 tokens",
        "Replicas for rho ≤ 0.8         6",
        "At B_max = 64                  $0.16 / M tokens",
        "At batch 16                    $0.41 / M tokens",
        "At 30% useful load             $0.53 / M tokens",
    ):
        assert line in out, line
    assert "Notes" not in out


def test_json_holds_inputs_and_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--config", str(WORKED_EXAMPLE_PATH), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["source"] == str(WORKED_EXAMPLE_PATH)
    assert document["inputs"]["workload"]["arrival_rate_per_s"] == 20
    plan = document["plan"]
    assert plan["memory"]["kv_bytes_per_token"] == 163_840
    assert plan["operating"]["b_max"] == 64
    assert plan["operating"]["limited_by"] == "tpot"
    assert plan["replicas"]["binding"] == "latency"
    assert (plan["replicas"]["n_base"], plan["replicas"]["n_replicas"]) == (2, 3)
    assert plan["spike"]["n_replicas"] == 6
    assert round(plan["cost"]["operating_usd_per_million_tokens"], 2) == 0.16
    assert plan["notes"] == []


def test_without_config_the_bundled_example_is_used(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert "bundled" in document["source"]
    assert document["plan"]["replicas"]["n_replicas"] == 3


def test_overrides_change_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--json", "--arrival-rate", "40", "--headroom", "0.25", "--compare-batch", "128"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["replicas"]["n_base"] == 3
    assert plan["replicas"]["n_replicas"] == 4
    assert plan["cost"]["compare_batch"] == 128


def test_infinite_values_become_null_in_json_and_a_note_in_the_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # N = 1: losing the only replica leaves no capacity at all.
    argv = ["--arrival-rate", "5", "--headroom", "0"]
    assert _run([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["replicas"]["n_replicas"] == 1
    assert plan["utilisation"]["one_lost_ratio"] is None
    assert plan["utilisation"]["one_lost_mmc_multiplier_ratio"] is None
    assert _run(argv) == 0
    out = capsys.readouterr().out
    assert "rho with one lost (N - 1 = 0)  ∞" in out
    assert "losing one replica overloads the pool" in out


def test_bad_flag_value_names_key_and_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--arrival-rate", "-3"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: workload.arrival_rate_per_s (from --arrival-rate): must be > 0, got -3.0\n"


def test_infeasible_slo_from_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--tpot-max-ms", "5"]) == 2
    assert capsys.readouterr().err.startswith("error: slo: no measured batch meets the SLO")


def test_bad_file_key_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = WORKED_EXAMPLE_PATH.read_text(encoding="utf-8").replace("n_kv_heads: 8", "n_kv_heads: eight")
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    assert _run(["--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error: model.n_kv_heads: must be a number")


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--config", str(tmp_path / "absent.yaml")]) == 2
    assert capsys.readouterr().err.startswith("error: config: cannot read")


def test_non_numeric_flag_is_rejected_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _run(["--arrival-rate", "fast"])
    assert info.value.code == 2
    assert "--arrival-rate" in capsys.readouterr().err


def test_destinations_do_not_collide_with_gateway_options() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    names = vars(parser.parse_args([]))
    assert all(name.startswith("plan_") for name in names)


def test_works_as_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="llm-gateway")
    parser.add_argument("--config")  # the gateway's own --config must not be clobbered
    commands = parser.add_subparsers(dest="command", required=True)
    cli.add_arguments(commands.add_parser("plan"))
    args = parser.parse_args(["--config", "gateway.yaml", "plan", "--json", "--headroom", "1"])
    assert args.config == "gateway.yaml"
    assert cli.run(args) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["replicas"]["n_replicas"] == 4


def test_python_dash_m_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    from capacity.__main__ import main

    assert main(["--json", "--spike-factor", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["spike"]["factor"] == 2
