"""`bench.gc_pauses`: the collection timer, a run's figures and the table of medians."""

from __future__ import annotations

import gc
from typing import Any

from bench.gc_pauses import CollectionTimer, _summary, _table


def test_the_timer_records_each_collection_by_generation_from_its_reset() -> None:
    timer = CollectionTimer()
    gc.callbacks.append(timer)
    try:
        gc.collect(0)
        timer.reset()
        gc.collect(1)
        gc.collect(2)
        gc.collect(2)
    finally:
        gc.callbacks.remove(timer)
    assert [len(timer.durations_s[g]) for g in (0, 1, 2)] == [0, 1, 2]
    assert all(d >= 0 for durations in timer.durations_s.values() for d in durations)


def _run(policy: str, full: list[float], probes: list[float]) -> dict[str, Any]:
    durations = {"0": [0.001] * 10, "1": [0.002], "2": full}
    return {
        "policy": policy,
        "rps": 100.0,
        "failed": 0,
        "probes_s": probes,
        "durations_s": durations,
        "wall_s": 2.0,
        "rss_mib": 90.0,
        "tracked": 1000,
        "frozen": 0,
    }


def test_a_run_is_summarised_in_milliseconds_and_per_second_of_load() -> None:
    summary = _summary(_run("default", [0.1, 0.3], [0.01] * 99 + [0.5]))
    assert summary["gen0"] == 10 and summary["gen1"] == 1 and summary["gen2"] == 2
    assert summary["gen2_max_ms"] == 300.0 and summary["gen2_p50_ms"] == 200.0
    assert summary["pause_max_ms"] == 300.0
    assert abs(summary["gc_ms_per_s"] - (10 + 2 + 400) / 2.0) < 1e-9
    assert summary["probe_max_ms"] == 500.0


def test_a_run_without_full_collections_reports_zero_pauses() -> None:
    summary = _summary(_run("gateway", [], [0.01]))
    assert summary["gen2"] == 0 and summary["gen2_max_ms"] == 0.0 and summary["pause_max_ms"] == 2.0


def test_the_table_gives_each_policy_its_median_and_range() -> None:
    runs = [_run("default", [x], [0.01]) for x in (0.1, 0.3, 0.2)] + [_run("gateway", [], [0.01])]
    table = _table(runs, ["default", "gateway"])
    default_row = next(line for line in table.splitlines() if line.startswith("| default"))
    assert "| 200 (100–300) |" in default_row  # gen2_max_ms: the median run, then the smallest and largest
    assert len(table.splitlines()) == 4
