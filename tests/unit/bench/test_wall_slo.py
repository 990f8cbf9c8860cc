"""The gateway of a local benchmark gets the report's SLO in its own wall seconds (bench/options.py)."""

from __future__ import annotations

import argparse

import pytest

from bench import commands
from bench.compare_presets import PresetParser
from bench.options import gateway_options, slo_of


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = PresetParser()
    commands.add_compare_arguments(parser)
    return parser.parse_args(argv)


def test_the_pool_slo_is_the_reports_divided_by_the_time_scale() -> None:
    args = _parse(["--speed", "0.5", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50"])
    slo = gateway_options(args).pool_overrides["slo"]
    assert slo == {"ttft_s": pytest.approx(4.0), "tpot_s": pytest.approx(0.1)}


def test_at_full_speed_it_is_the_reports() -> None:
    slo = gateway_options(_parse(["--slo-ttft-ms", "1500"])).pool_overrides["slo"]
    assert slo["ttft_s"] == pytest.approx(1.5)


def test_pool_set_and_variants_override_it() -> None:
    args = _parse(["--speed", "0.5", "--pool-set", "slo={tpot_s: 0.2}"])
    slo = gateway_options(args).pool_overrides["slo"]
    assert slo == {"ttft_s": pytest.approx(4.0), "tpot_s": 0.2}
    variant = gateway_options(args, variant=["slo.ttft_s=9"]).pool_overrides["slo"]
    assert variant["ttft_s"] == 9


def test_a_gateway_template_keeps_its_own_slo(tmp_path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("pools: []\n")
    args = _parse(["--speed", "0.5", "--gateway-config", str(config)])
    assert "slo" not in gateway_options(args).pool_overrides


def test_class_slo_judges_a_class_of_the_mix_by_its_own_objectives() -> None:
    args = _parse(
        ["--priority-mix", "interactive=0.7,batch=0.3", "--class-slo", "batch=60000", "--slo-tpot-ms", "40"]
    )
    slo = slo_of(args)
    assert slo.for_class("batch") == (pytest.approx(60.0), pytest.approx(0.04))
    assert slo.for_class("interactive") == (pytest.approx(2.0), pytest.approx(0.04))
    assert gateway_options(args).pool_overrides["slo"]["ttft_s"] == pytest.approx(2.0), "the gateway's stays"
    both = slo_of(_parse(["--priority-mix", "batch=1", "--class-slo", "batch=30000:80"]))
    assert both.for_class("batch") == (pytest.approx(30.0), pytest.approx(0.08))
    assert both.to_ms()["classes"] == {"batch": {"ttft": pytest.approx(30000.0), "tpot": pytest.approx(80.0)}}
    trace = slo_of(_parse(["--class-slo", "bulk=9000"]))  # no mix: a trace's own classes
    assert trace.for_class("bulk") == (pytest.approx(9.0), pytest.approx(0.05))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--priority-mix", "interactive=1", "--class-slo", "batch=60000"], "not a --priority-mix class"),
        (["--priority-mix", "batch=1", "--class-slo", "batch=nan"], "positive objectives"),
        (["--priority-mix", "batch=1", "--class-slo", "batch=1000:inf"], "positive objectives"),
        (["--priority-mix", "batch=1", "--class-slo", "batch"], "is not CLASS=TTFT_MS"),
        (["--priority-mix", "batch=1", "--class-slo", "batch=soon"], "is not CLASS=TTFT_MS"),
        (["--priority-mix", "batch=1", "--class-slo", "batch=0"], "positive objectives"),
        (["--priority-mix", "batch=1", "--class-slo", "batch=1:2", "--class-slo", "batch=3"], "given twice"),
    ],
)
def test_a_bad_class_slo_is_refused_with_its_reason(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        slo_of(_parse(argv))
