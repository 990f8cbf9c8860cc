"""Run summaries from hand-made samples, and the markdown / JSON / overhead reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.overhead_report import render_overhead
from bench.profile_stages import HANDLER, STAGES
from bench.report import markdown_table, render_markdown, write_report
from bench.sample import Sample
from bench.stats import Slo
from bench.summary import RunResult, scale_sample, summarize

SLO = Slo(ttft_s=0.5, tpot_s=0.05)


def ok(
    index: int, sent: float, e2e: float, ttft: float, *, tpot: float, tokens: int, replica: str, **kw: object
) -> Sample:
    return Sample(index, sent, sent, 200, True, e2e, ttft, tpot, tokens, replica=replica, **kw)  # type: ignore[arg-type]


def samples() -> list[Sample]:
    return [
        ok(0, 0.0, 1.0, 0.2, tpot=0.04, tokens=20, replica="a:1", priority="critical"),
        ok(1, 1.0, 2.0, 0.4, tpot=0.03, tokens=40, replica="a:1", priority="batch"),
        ok(2, 2.0, 2.0, 0.9, tpot=0.01, tokens=10, replica="b:2", priority="batch"),  # TTFT over the SLO
        Sample(
            3, 3.0, 3.0, 429, False, 0.002, reject_reason="queue_full", retry_after_s=2.0, priority="batch"
        ),
        Sample(4, 3.5, 3.5, 503, False, 0.004, reject_reason="no_replica", priority="critical"),
        Sample(5, 3.6, 3.6, 0, False, 0.5, error="ConnectError"),
    ]


def test_summary_counts_window_throughput_and_goodput() -> None:
    summary = summarize(samples(), SLO, replica_ids=["a:1", "b:2", "c:3"])
    assert (summary["requests"], summary["ok"], summary["rejected"], summary["errors"]) == (6, 3, 2, 1)
    assert summary["window_s"] == [0.0, 4.1]  # last answer: 3.6 + 0.5
    assert summary["throughput"]["requests_per_s"] == pytest.approx(3 / 4.1)
    assert summary["throughput"]["output_tokens_per_s"] == pytest.approx(70 / 4.1)
    assert summary["goodput"]["requests"] == 2
    assert summary["goodput"]["output_tokens"] == 60
    assert summary["goodput"]["attainment_ratio"] == pytest.approx(2 / 6)
    assert summary["ttft_ms"]["p50"] == pytest.approx(400.0)
    assert summary["e2e_ms"]["max"] == pytest.approx(2000.0)
    assert summary["replicas"]["requests"] == {"a:1": 2, "b:2": 1, "c:3": 0}
    assert summary["replicas"]["max_mean_ratio"] == pytest.approx(2.0)  # mean 1


def test_summary_outcomes_and_classes() -> None:
    summary = summarize(samples(), SLO)
    outcomes = summary["outcomes"]
    assert set(outcomes) == {"queue_full", "no_replica", "ConnectError"}
    assert outcomes["queue_full"]["latency_ms"]["p50"] == pytest.approx(2.0)
    assert outcomes["queue_full"]["retry_after_present_ratio"] == 1.0
    assert outcomes["queue_full"]["retry_after_mean_s"] == 2.0
    assert outcomes["no_replica"]["retry_after_present_ratio"] == 0.0
    classes = summary["per_class"]
    assert classes["critical"]["attainment_ratio"] == pytest.approx(0.5)
    assert classes["batch"]["requests"] == 3 and classes["batch"]["slo_met"] == 1
    assert classes["default"]["requests"] == 1


def test_a_class_with_objectives_of_its_own_is_judged_by_them() -> None:
    """`batch` judged by a 1 s TTFT: its 0.9 s request now meets the SLO, in goodput and in its class;
    the other classes keep the pool's objectives, and the report records both."""
    slo = Slo(ttft_s=0.5, tpot_s=0.05, classes=(("batch", 1.0, 0.05),))
    summary = summarize(samples(), slo)
    assert summary["goodput"]["requests"] == 3
    assert summary["per_class"]["batch"]["slo_met"] == 2
    assert summary["per_class"]["critical"]["slo_met"] == 1
    assert summary["slo"] == {
        "ttft_ms": 500.0,
        "tpot_ms": 50.0,
        "classes": {"batch": {"ttft_ms": 1000.0, "tpot_ms": 50.0}},
    }
    assert summarize(samples(), SLO)["slo"] == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    strict = Slo(ttft_s=0.5, tpot_s=0.05, classes=(("batch", 1.0, 0.02),))  # its TPOT of 0.03 now misses
    assert summarize(samples(), strict)["per_class"]["batch"]["slo_met"] == 1


def test_class_objectives_apply_to_simulated_time() -> None:
    """With a time scale the samples are scaled before they are judged: a 1.2 s wall TTFT is 0.6 s
    simulated, within `batch`'s own 0.6 s objective and over the pool's 0.5 s."""
    sample = ok(0, 0.0, 3.0, 1.2, tpot=0.02, tokens=20, replica="a:1", priority="batch")
    slo = Slo(ttft_s=0.5, tpot_s=0.05, classes=(("batch", 0.6, 0.05),))
    assert summarize([sample], slo, time_scale=0.5)["goodput"]["requests"] == 1
    assert summarize([sample], SLO, time_scale=0.5)["goodput"]["requests"] == 0


def test_time_scale_reports_simulated_latency_but_wall_rejections() -> None:
    summary = summarize(samples(), Slo(ttft_s=5.0, tpot_s=0.5), time_scale=10.0)
    assert summary["ttft_ms"]["p50"] == pytest.approx(4000.0)
    assert summary["window_s"] == pytest.approx([0.0, 41.0])
    assert summary["throughput"]["requests_per_s"] == pytest.approx(3 / 41.0)
    assert summary["goodput"]["requests"] == 2  # 9 s TTFT misses the 5 s SLO
    assert summary["outcomes"]["queue_full"]["latency_ms"]["p50"] == pytest.approx(2.0)
    scaled = scale_sample(samples()[0], 10.0)
    assert (scaled.ttft_s, scaled.tpot_s, scaled.sent_s) == pytest.approx((2.0, 0.4, 0.0))


def result(label: str = "prefix-affinity", level: float = 4.0) -> RunResult:
    summary = summarize(samples(), SLO, replica_ids=["a:1", "b:2"])
    summary["engine"] = {"prefix_cache_hit_ratio": 0.875, "load_max_mean_ratio": 1.1}
    return RunResult(label, level, "rate", samples(), summary, params={"x": 1})


def test_markdown_table_row() -> None:
    table = markdown_table([result()]).splitlines()
    assert table[0].startswith("| run | load | req | ok | rej | err | TTFT p50/p95/p99 ms")
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert cells[:6] == ["prefix-affinity", "4.00", "6", "3", "2", "1"]
    assert cells[6] == "400 / 850 / 890"  # 200, 400, 900 ms
    assert cells[13] == "–", "no GPU count outside a local fleet"
    assert cells[14] == "33%" and cells[15] == "88%" and cells[16] == "1.33" and cells[17] == "1.10"


def test_render_markdown_lists_classes_and_outcomes() -> None:
    text = render_markdown("bench run: x", {"params": {"workload": {"name": "zipf"}}}, [result()])
    assert text.startswith("# bench run: x")
    assert '- workload: `{"name": "zipf"}`' in text
    assert "| prefix-affinity | 4.00 | 33% of 3 | 50% of 2 | 0% of 1 |" in text  # batch, critical, default
    assert "queue_full × 1 (status 429)" in text and "Retry-After on 100%" in text


def test_write_report_files(tmp_path: Path) -> None:
    written = write_report(tmp_path, "t", {"params": {}}, [result(), result("round-robin", 8.0)], plots=False)
    names = sorted(p.name for p in written)
    assert names == [
        "report.json",
        "report.md",
        "samples-00-prefix-affinity.jsonl",
        "samples-01-round-robin.jsonl",
    ]
    data = json.loads((tmp_path / "report.json").read_text())
    assert [r["label"] for r in data["runs"]] == ["prefix-affinity", "round-robin"]
    assert data["runs"][0]["goodput"]["requests"] == 2
    rows = (tmp_path / "samples-00-prefix-affinity.jsonl").read_text().splitlines()
    assert Sample.from_json(json.loads(rows[3])) == samples()[3]


def test_write_report_with_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    written = write_report(tmp_path, "t", {"params": {}}, [result(), result(level=8.0)], plots=True)
    assert {"latency_cdf.png", "goodput_vs_load.png"} <= {p.name for p in written}


def test_overhead_report_checks_targets() -> None:
    result = {
        "latency": {
            "e2e_ms": {
                "direct": {"p50": 1.0, "p99": 2.0, "mean": 1.1},
                "gateway": {"p50": 1.3, "p99": 3.5, "mean": 1.5},
                "added": {"p50": 0.3, "p99": 1.5, "mean": 0.4},
            },
            "gateway_cpu_us_per_request": {"stat_us": 400.0, "schedstat_us": 390.0},
        },
        "throughput": {"direct_rps": 1000.0, "gateway_rps": 800.0, "ratio": 0.8},
        "streams": [
            {
                "path": "gateway",
                "streams": 64,
                "ok": 64,
                "stalled": 0,
                "sustained": True,
                "frames": 100,
                "frames_per_s": 50.0,
                "wall_s": 2.0,
                "max_gap_ms": {"p50": 1, "p99": 2, "max": 3},
                "ttft_ms": None,
                "cpu_us_per_stream": {"stat_us": 700.0},
            },
        ],
    }
    meta = {"pinning": {}, "params": {"stream_token_delay_ms": 50.0, "stream_tokens": 32, "stall_ms": 1000}}
    text = render_overhead(meta, result)
    assert "| added latency p50, c=1 (ms) | 0.300 | ≤ 0.4 | yes |" in text
    assert "| added latency p99, c=1 (ms) | 1.500 | ≤ 1 | no |" in text
    assert "| gateway CPU per request (µs) | 400 | ≤ 250 | no |" in text
    assert "| throughput gateway ÷ direct | 0.800 | ≥ 0.7 | yes |" in text
    assert "| concurrent streams sustained, gateway | 64 | ≥ 512 | no |" in text
    assert "| 64 | gateway | 64 | 0 | 50 | 1280 | – | 2.000 | 700 | – |" in text  # nominal 64 × 20/s
    assert "nominal duration 1600 ms" in text


def test_a_late_client_is_flagged() -> None:
    on_time = [Sample(i, 0.1 * i, 0.1 * i, 200, True, 0.1, 0.05) for i in range(10)]
    late = [Sample(i, 0.1 * i, 0.1 * i + 0.2, 200, True, 0.1, 0.05) for i in range(10)]
    assert summarize(on_time, SLO)["warnings"] == []
    assert "sent late" in summarize(late, SLO)["warnings"][0]
    assert summarize(on_time, SLO)["wall_frames_per_s"] == 0.0  # no frames recorded


def test_outcomes_show_the_gateway_side_rejection_latency_when_scraped() -> None:
    run = result()
    run.summary["engine"] = {
        "gateway_rejections": {
            "queue_full": {"count": 1, "p50_ms": 0.75, "p99_ms": 1.98, "within_5ms_ratio": 1.0},
        }
    }
    text = render_markdown("t", {"params": {}}, [run])
    assert "gateway-side × 1: p50/p99 0.75/1.98 ms, 100.0% within 5 ms" in text
    assert "gateway-side" not in render_markdown("t", {"params": {}}, [result()])


def test_overhead_report_sets_the_gateway_beside_the_floor_and_reference_proxies() -> None:
    def dist(p50: float, p99: float) -> dict[str, float]:
        return {"p50": p50, "p99": p99, "mean": p50}

    def cpu(us: float) -> dict[str, float]:
        return {"stat_us": us, "schedstat_us": us}

    result = {
        "latency": {
            "e2e_ms": {"added": dist(0.5, 1.0), "added_reference": dist(0.25, 0.5)},
            "gateway_cpu_us_per_request": cpu(600.0),
            "reference_cpu_us_per_request": cpu(120.0),
            "floor_cpu_us_per_request": cpu(240.0),
        },
        "throughput": {
            "ratio": 0.2,
            "reference_ratio": 0.8,
            "gateway_cpu_us_per_request": [cpu(500.0), cpu(700.0)],
            "reference_cpu_us_per_request": [cpu(100.0), cpu(100.0)],
            "floor_cpu_us_per_request": [cpu(150.0), cpu(250.0)],
            "e2e_ms": {"direct": dist(1.0, 2.0), "gateway": dist(9.0, 90.0), "added": dist(8.0, 88.0)},
        },
        "stream_throughput": {
            "gateway_cpu_us_per_request": [cpu(900.0)],
            "reference_cpu_us_per_request": [cpu(300.0)],
        },
        "profile": {
            "concurrency": 64,
            "seconds": 5.0,
            "non-streamed": {"samples": 10, "shares": {s: (1.0 if s == HANDLER else 0.0) for s in STAGES}},
        },
    }
    meta = {"argv": ["overhead", "--pin"], "params": {"throughput_concurrency": 64, "stream_tokens": 32}}
    text = render_overhead(meta, result)
    # gateway | floor | reference | gateway ÷ floor | floor ÷ reference | gateway ÷ reference | target
    assert (
        "| CPU µs per non-streamed request, closed loop | 600 | 200 | 100 | 3.000 | 2.000 | 6.000 | ≤ 1.0 |"
        in text
    )
    assert "| CPU µs per non-streamed request, c=1 | 600 | 240 | 120 | 2.500 | 2.000 | 5.000 | – |" in text
    # no floor figure (a run without it): its cells are empty, gateway ÷ reference stays
    assert "| CPU µs per stream, closed loop | 900 | – | 300 | – | – | 3.000 | ≤ 1.0 |" in text
    assert "| added latency p99, c=1 (ms) | 1.000 | – | 0.500 | – | – | 2.000 | – |" in text
    assert "| max req/s × direct | 0.200 | – | 0.800 | – | – | 0.250 | – |" in text
    assert "| CPU µs per stream, c=1 | – | – | – | – | – | – | – |" in text  # not measured: no figure
    assert "| throughput e2e | added | 8.000 | 88 | 8.000 |" in text
    assert f"| {HANDLER} | 100.0 % |" in text
    assert "Command: `llm-gateway bench overhead --pin`" in text


def test_overhead_report_without_a_reference_has_no_comparison() -> None:
    result = {"latency": {"gateway_cpu_us_per_request": {"stat_us": 1.0, "schedstat_us": 1.0}}}
    assert "gateway ÷ reference" not in render_overhead({"params": {}}, result)
