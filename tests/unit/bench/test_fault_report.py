"""The report's fault fields: complete answers and failure labels, the gateway's containment counters and
breaker openings from /metrics, what each fault event did, and the markdown sections."""

from __future__ import annotations

from typing import Any

import pytest

from bench.fault_report import answers, event_effects, failure_label, is_complete, render_fault_sections
from bench.gateway_metrics import (
    BreakerLog,
    counter_deltas,
    parse_breakers,
    parse_counters,
    summarize_gateway,
    total,
)
from bench.report import render_markdown
from bench.sample import Sample
from bench.stats import Slo
from bench.summary import RunResult, summarize

SLO = Slo(ttft_s=0.5, tpot_s=0.05)


def stream(index: int, sent: float, e2e: float, *, tokens: int = 8, asked: int = 8, **kw: Any) -> Sample:
    fields: dict[str, Any] = {"ttft_s": 0.1, "tpot_s": 0.01, "output_tokens": tokens, "max_tokens": asked}
    fields.update(kw)
    ok = fields.pop("ok", True)
    status = fields.pop("status", 200)
    return Sample(index, sent, sent, status, ok, e2e, **fields)


def samples() -> list[Sample]:
    return [
        stream(0, 0.0, 1.0, replica="a:1"),  # complete
        stream(1, 0.5, 1.0, replica="a:1", tokens=5),  # [DONE] but short
        stream(2, 1.0, 1.5, replica="a:1", ok=False, error="upstream_protocol"),  # terminal SSE event
        stream(3, 1.2, 0.4, replica="b:2", ok=False, error="truncated"),
        stream(4, 2.0, 2.0, ok=False, status=422, reject_reason="request_quarantined", poisoned=True),
        stream(5, 2.5, 3.0, ok=False, status=504, reject_reason="upstream_ttft_timeout", poisoned=True),
        stream(6, 3.0, 0.01, ok=False, status=0, error="ConnectionResetError"),
        stream(7, 3.5, 1.0, replica="b:2", ttft_s=0.9),  # complete, misses the TTFT SLO
    ]


def test_complete_answers_and_failure_labels() -> None:
    s = samples()
    assert [is_complete(x, stream=True) for x in s] == [True, False, False, False, False, False, False, True]
    labels = [failure_label(x, stream=True) for x in s]
    assert labels == [
        None,
        "short",
        "sse upstream_protocol",
        "sse truncated",
        "422 request_quarantined",
        "504 upstream_ttft_timeout",
        "transport ConnectionResetError",
        None,
    ]
    assert is_complete(s[1], stream=False), "a non-streamed 200 is complete"
    assert failure_label(Sample(9, 0, 0, 500, False, 0.1), stream=True) == "500 no reason"


def test_answers_split_good_traffic_from_poisoned_requests() -> None:
    a = answers(samples(), SLO, stream=True)
    assert a["all"] == {"requests": 8, "complete": 2, "complete_ratio": 0.25, "short": 1}
    assert a["good"]["requests"] == 6 and a["good"]["complete"] == 2
    assert a["good"]["complete_ratio"] == pytest.approx(2 / 6)
    assert (a["good"]["slo_met"], a["good"]["attainment_ratio"]) == (1, pytest.approx(1 / 6))
    assert a["poisoned"]["requests"] == 2 and a["poisoned"]["complete"] == 0
    assert a["poisoned"]["held_ms"] == {"p50": pytest.approx(2500.0), "max": pytest.approx(3000.0)}
    assert a["good_failures"] == {
        "short": 1,
        "sse truncated": 1,
        "sse upstream_protocol": 1,
        "transport ConnectionResetError": 1,
    }
    assert a["poisoned_failures"] == {"422 request_quarantined": 1, "504 upstream_ttft_timeout": 1}
    assert sum(a["failures"].values()) == 6
    empty = answers([], SLO, stream=True)
    assert empty["all"]["complete_ratio"] is None and empty["poisoned"]["held_ms"] is None


GATEWAY_START = """# HELP llm_gateway_upstream_failures_total x
# TYPE llm_gateway_upstream_failures_total counter
llm_gateway_upstream_failures_total{cause="replica",kind="connect",model="m"} 2.0
llm_gateway_upstream_failures_total{cause="request",kind="ttft_timeout",model="m"} 1.0
llm_gateway_upstream_failures_created{cause="replica",kind="connect",model="m"} 1.7e9
llm_gateway_stream_continuations_total{model="m"} 1.0
llm_gateway_breaker_state{replica="127.0.0.1:1"} 0.0
llm_gateway_breaker_state{replica="127.0.0.1:2"} 2.0
"""
GATEWAY_END = """llm_gateway_upstream_failures_total{cause="replica",kind="connect",model="m"} 5.0
llm_gateway_upstream_failures_total{cause="request",kind="ttft_timeout",model="m"} 1.0
llm_gateway_upstream_failures_total{cause="load",kind="ttft_timeout",model="m"} 4.0
llm_gateway_upstream_failures_total{cause="replica",kind="broken_stream",model="other"} 1.0
llm_gateway_stream_continuations_total{model="m"} 7.0
llm_gateway_quarantine_total{model="m",outcome="quarantined"} 3.0
llm_gateway_quarantine_total{model="m",outcome="refused"} 1.0
llm_gateway_ejections_refused_total{model="m"} 2.0
llm_gateway_retries_total{reason="connect"} 6.0
"""


def test_gateway_counters_over_the_window() -> None:
    start, end = parse_counters(GATEWAY_START), parse_counters(GATEWAY_END)
    assert start["upstream_failures"] == {"replica/connect": 2.0, "request/ttft_timeout": 1.0}
    deltas = counter_deltas(start, end)
    assert deltas["upstream_failures"] == {
        "load/ttft_timeout": 4,
        "replica/broken_stream": 1,
        "replica/connect": 3,
    }
    assert deltas["stream_continuations"] == {"": 6}
    assert deltas["quarantine"] == {"quarantined": 3, "refused": 1}
    assert total(deltas, "upstream_failures", "replica/") == 4
    assert total(deltas, "upstream_failures") == 8
    assert total(deltas, "panic_decisions") == 0
    assert not any(parse_counters("nothing here\n").values())
    assert parse_breakers(GATEWAY_START) == {"127.0.0.1:1": 0.0, "127.0.0.1:2": 2.0}


def test_breaker_openings_are_transitions_into_open_within_the_window() -> None:
    log = BreakerLog(
        [
            (0.0, {"a": 2.0, "b": 0.0}),  # before the window: not counted
            (1.0, {"a": 1.0, "b": 2.0}),  # b opens
            (2.0, {"a": 2.0, "b": 2.0}),  # a re-opens after a failed probe; b still open
            (3.0, {"a": 0.0, "b": 1.0, "c": 0.0}),
            (4.0, {"a": 0.0, "b": 2.0, "c": 0.0}),  # b re-opens
            (9.0, {"a": 2.0, "b": 2.0, "c": 0.0}),  # after the window
        ]
    )
    assert log.openings(0.5, 5.0) == {"a": 1, "b": 2, "c": 0}
    assert log.max_open_at_once(0.5, 5.0) == 2
    summary = summarize_gateway({}, {"retries": {"x": 1.0}}, log, (0.5, 5.0), 0.5)
    assert summary is not None
    assert summary["breakers"]["opened_total"] == 3 and summary["counters"] == {"retries": {"x": 1}}
    assert summarize_gateway(None, {}, log, (0, 1), 0.5) is None


def test_event_effects_for_a_kill_and_a_restart() -> None:
    s = [*samples(), stream(8, 6.0, 0.5, replica="a:1")]
    log: list[dict[str, Any]] = [
        {"action": "kill", "status": "done", "replica_id": "a:1", "ran_at_run_s": 1.2, "detail": ""},
        {
            "action": "restart",
            "status": "done",
            "replica_id": "a:1",
            "ran_at_run_s": 4.0,
            "ready_at_run_s": 4.5,
        },
        {
            "action": "restart",
            "status": "done",
            "replica_id": "z:9",
            "ran_at_run_s": 4.0,
            "ready_at_run_s": 4.5,
        },
    ]
    kill, restart, nobody = event_effects(log, s, stream=True)
    assert (kill["in_flight"], kill["in_flight_complete"]) == (2, 0)  # samples 1 (short) and 2 (broken)
    assert restart["first_served_after_s"] == pytest.approx(1.5)
    assert nobody["first_served_after_s"] is None


def _result(label: str, with_faults: bool) -> RunResult:
    measured = samples()
    summary = summarize(measured, SLO)
    summary["answers"] = answers(measured, SLO, stream=True)
    summary["engine"] = {
        "gateway": summarize_gateway(
            parse_counters(GATEWAY_START),
            parse_counters(GATEWAY_END),
            BreakerLog([(1.0, {"a": 2.0})]),
            (0, 9),
            0.5,
        )
    }
    if with_faults:
        summary["faults"] = [
            {
                "fault": "at=1s kill=0",
                "replica_id": "a:1",
                "status": "done",
                "ran_at_s": 1.0,
                "took_s": 0.01,
                "detail": "SIGKILL pid 7",
                "in_flight": 2,
                "in_flight_complete": 0,
            },
            {
                "fault": "at=4s restart=0",
                "replica_id": "a:1",
                "status": "done",
                "ran_at_s": 4.0,
                "took_s": 0.4,
                "detail": "pid 8",
                "first_served_after_s": 1.5,
            },
            {
                "fault": "at=60s clear=1",
                "replica_id": "b:2",
                "status": "skipped",
                "ran_at_s": None,
                "took_s": None,
                "detail": "",
            },
        ]
    return RunResult(label, 8.0, "rate", measured, summary)


def test_the_markdown_shows_the_fault_tables() -> None:
    md = render_markdown("t", {"params": {}}, [_result("contained", True), _result("neither", False)])
    assert "| contained | 8 (2) | " in md
    assert "| 16.7% | 25.0% (2/8) | 33.3% (2/6) | 1 | 2500 / 3000 |" in md, "a short stream is not SLO met"
    assert "| contained | 1 (1) | 2 | 6 | 3 / 1 | 4 / 0 / 4 | 6 | 0 |" in md
    assert "| run | 422 request_quarantined | 504 upstream_ttft_timeout | short | sse truncated |" in md
    assert "| contained | 0 + 1 | 0 + 1 | 1 | 1 | 1 | 1 |" in md
    assert (
        "- contained: `at=1s kill=0` (a:1) done, ran at 1.00 s, took 0.01 s: SIGKILL pid 7; 2 measured" in md
    )
    assert "first request answered there 1.50 s after /health 200" in md
    assert "- contained: `at=60s clear=1` (b:2) skipped, not reached" in md
    plain = _result("plain", False)
    plain.summary["answers"]["poisoned"]["requests"] = 0
    assert render_fault_sections([plain]) == []
