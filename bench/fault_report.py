"""Answers under faults: the complete-answer ratio, errors by reason, what each fault event did, and the
markdown tables of a run with a fault schedule or a poison fraction.

A *complete* answer is a stream that ended in `[DONE]` with no terminal error event and the full number
of tokens asked (`completion_tokens` of its usage ≥ `max_tokens`), or a non-streamed 200. A stream that
ended in `[DONE]` with fewer tokens is *short* (a splice that lost tokens would show here). Failures are
labelled by where they ended: `<status> <x-gateway-reject-reason>` before the first byte, `sse <code>`
for a stream cut by a terminal error event (`sse truncated`: no `[DONE]` and no event), `transport
<error>` when the connection failed. Poisoned requests (their text carries the marker) are counted
apart: they cannot succeed, so the ratios of *good traffic* are the ones a fault must not move.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from bench.gateway_metrics import total
from bench.sample import Sample
from bench.stats import Distribution, Slo
from bench.summary import RunResult

MS = 1000.0


def is_complete(sample: Sample, stream: bool) -> bool:
    if not sample.ok:
        return False
    return not stream or sample.max_tokens is None or sample.output_tokens >= sample.max_tokens


def failure_label(sample: Sample, stream: bool) -> str | None:
    """Why `sample` is not a complete answer (None when it is)."""
    if sample.ok:
        return None if is_complete(sample, stream) else "short"
    if sample.status == 200:
        return f"sse {sample.error or 'truncated'}"
    if sample.status == 0:
        return f"transport {sample.error or 'error'}"
    return f"{sample.status} {sample.reject_reason or 'no reason'}"


def _group(samples: Sequence[Sample], stream: bool) -> dict[str, Any]:
    complete = sum(1 for s in samples if is_complete(s, stream))
    return {
        "requests": len(samples),
        "complete": complete,
        "complete_ratio": complete / len(samples) if samples else None,
        "short": sum(1 for s in samples if s.ok and not is_complete(s, stream)),
    }


def _labels(samples: Iterable[Sample], stream: bool) -> dict[str, int]:
    counts = Counter(label for s in samples if (label := failure_label(s, stream)) is not None)
    return dict(sorted(counts.items()))


def answers(samples: Sequence[Sample], slo: Slo, stream: bool) -> dict[str, Any]:
    """The measured samples' answers: complete ratios overall, for good traffic and for poisoned
    requests, the SLO attainment of good traffic (complete answers that met both SLOs ÷ good requests),
    and failures by label."""
    good = [s for s in samples if not s.poisoned]
    poisoned = [s for s in samples if s.poisoned]
    met = sum(1 for s in good if slo.met_by(s) and is_complete(s, stream))
    held = Distribution.of([s.e2e_s for s in poisoned])
    return {
        "stream": stream,
        "all": _group(samples, stream),
        "good": {
            **_group(good, stream),
            "slo_met": met,
            "attainment_ratio": met / len(good) if good else None,
        },
        "poisoned": {
            **_group(poisoned, stream),
            "held_ms": None if held is None else {"p50": held.p50 * MS, "max": held.max * MS},
        },
        "failures": _labels(samples, stream),
        "good_failures": _labels(good, stream),
        "poisoned_failures": _labels(poisoned, stream),
    }


def event_effects(log: list[dict[str, Any]], samples: Sequence[Sample], stream: bool) -> list[dict[str, Any]]:
    """The event log, each kill with the measured requests its replica had in flight then (and how many
    still completed), each restart with the delay from /health 200 to the first request that replica
    answered (`x-gateway-replica`)."""
    measured = [s for s in samples if not s.warmup]
    out = []
    for record in log:
        row = dict(record)
        replica, at = record["replica_id"], record["ran_at_run_s"]
        if record["action"] == "kill" and record["status"] == "done" and at is not None:
            hit = [s for s in measured if s.replica == replica and s.sent_s <= at < s.done_s]
            row["in_flight"] = len(hit)
            row["in_flight_complete"] = sum(1 for s in hit if is_complete(s, stream))
        ready = record.get("ready_at_run_s")
        if record["action"] == "restart" and ready is not None:
            after = [s.sent_s for s in measured if s.replica == replica and s.ok and s.sent_s >= ready]
            row["first_served_after_s"] = min(after) - ready if after else None
        out.append(row)
    return out


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _of(group: dict[str, Any]) -> str:
    return f"{_pct(group['complete_ratio'])} ({group['complete']}/{group['requests']})"


def answers_table(results: Sequence[RunResult]) -> str:
    lines = [
        "| run | req (poisoned) | goodput req/s | goodput tok/s | SLO met, good traffic | complete, all "
        "| complete, good traffic | short | poisoned: held p50 / max ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        a, good = r.summary["answers"], r.summary["goodput"]
        held = a["poisoned"]["held_ms"]
        held_text = "–" if held is None else f"{held['p50']:.0f} / {held['max']:.0f}"
        lines.append(
            f"| {r.label} | {a['all']['requests']} ({a['poisoned']['requests']}) | "
            f"{good['requests_per_s']:.2f} | {good['output_tokens_per_s']:.0f} | "
            f"{_pct(a['good']['attainment_ratio'])} | {_of(a['all'])} | {_of(a['good'])} | "
            f"{a['all']['short']} | {held_text} |"
        )
    return "\n".join(lines)


def gateway_table(results: Sequence[RunResult]) -> str:
    lines = [
        "| run | breakers opened (max open at once) | ejections refused | continuations | quarantined / "
        "refused at arrival | failures charged replica / request / load | retries | panic decisions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        gateway = (r.summary.get("engine") or {}).get("gateway")
        if gateway is None:
            lines.append(f"| {r.label} | – | – | – | – | – | – | – |")
            continue
        c = gateway["counters"]
        breakers = gateway.get("breakers")
        opened = "–" if breakers is None else f"{breakers['opened_total']} ({breakers['max_open_at_once']})"
        charged = " / ".join(
            str(total(c, "upstream_failures", f"{k}/")) for k in ("replica", "request", "load")
        )
        lines.append(
            f"| {r.label} | {opened} | {total(c, 'ejections_refused')} | "
            f"{total(c, 'stream_continuations')} | {total(c, 'quarantine', 'quarantined')} / "
            f"{total(c, 'quarantine', 'refused')} | {charged} | {total(c, 'retries')} | "
            f"{total(c, 'panic_decisions')} |"
        )
    return "\n".join(lines)


def failures_table(results: Sequence[RunResult]) -> str:
    """Failures by label: good traffic, then poisoned requests (`n + m`)."""
    labels = sorted({k for r in results for k in r.summary["answers"]["failures"]})
    if not labels:
        return ""
    lines = ["| run | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for r in results:
        a = r.summary["answers"]
        cells = []
        for label in labels:
            good, bad = a["good_failures"].get(label, 0), a["poisoned_failures"].get(label, 0)
            cells.append("0" if not good and not bad else f"{good} + {bad}" if bad else str(good))
        lines.append(f"| {r.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def event_lines(results: Sequence[RunResult]) -> list[str]:
    lines = []
    for r in results:
        for e in r.summary.get("faults") or []:
            when = "not reached" if e["ran_at_s"] is None else f"ran at {e['ran_at_s']:.2f} s"
            took = "" if e["took_s"] is None else f", took {e['took_s']:.2f} s"
            extra = ""
            if "in_flight" in e:
                extra = (
                    f"; {e['in_flight']} measured requests in flight there, "
                    f"{e['in_flight_complete']} complete"
                )
            if e.get("first_served_after_s") is not None:
                extra = f"; first request answered there {e['first_served_after_s']:.2f} s after /health 200"
            elif "first_served_after_s" in e:
                extra = "; no request answered there afterwards"
            detail = f": {e['detail']}" if e["detail"] else ""
            lines.append(
                f"- {r.label}: `{e['fault']}` ({e['replica_id']}) {e['status']}, {when}{took}{detail}{extra}"
            )
    return lines


def render_fault_sections(results: Sequence[RunResult]) -> list[str]:
    """The markdown of the fault figures (empty unless some run had faults or poisoned requests)."""
    if not any(
        r.summary.get("faults") or (r.summary.get("answers") or {}).get("poisoned", {}).get("requests")
        for r in results
    ):
        return []
    parts = [
        "Answers under faults (complete: `[DONE]` with every token asked, or a non-streamed 200; good "
        "traffic: the requests without the poison marker):",
        "",
        answers_table(results),
        "",
        "What the gateway did (its /metrics over the measured window; breakers read every poll):",
        "",
        gateway_table(results),
        "",
    ]
    failures = failures_table(results)
    if failures:
        parts += ["Failures by how they ended (good traffic + poisoned):", "", failures, ""]
    events = event_lines(results)
    if events:
        parts += [
            "Fault events (offsets from the start of the measured window, wall clock):",
            "",
            *events,
            "",
        ]
    return parts
