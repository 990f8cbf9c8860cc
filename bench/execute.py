"""One experiment against one target at one load level: build the plan, run it, summarise it.

Simulated time. A local fleet whose engines run `--speed S` times faster than wall time serves in
*simulated* seconds; with `time_scale = S` every user-facing time is in those units: rates are requests
per simulated second (sent S× faster in wall time), durations, warm-up and SLOs are simulated seconds,
and latencies and throughput are reported in simulated units (wall × S), so figures compare with the
engine profile's physics. Rejection latency is the gateway's own and stays in wall milliseconds.

Faults (`bench.faults`): a poison fraction changes the requests (the same ones for every target); a
fault schedule runs against the target's `fleet` from the first measured send, in wall seconds, and its
log goes into the summary (`faults`), with the breakers of the gateway read at every poll.

Several gateway instances (`Target.also_urls`): requests go to the instances in turn, one request each
(`RoundRobinUrls`), as an L4 load balancer spreads connections; turns of one conversation stay in order
(the runner's session lock) but may reach different instances. Every instance is scraped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from bench.arrivals import ClosedLoop, describe, make_arrivals
from bench.client import BenchClient, Client, ClientOptions
from bench.engine_metrics import EngineSampler, LoadSeries
from bench.fault_report import answers, event_effects
from bench.fault_runner import FaultRunner, FleetControl
from bench.faults import FaultEvent, Poison, with_poison
from bench.gateway_metrics import BreakerLog
from bench.oracle import PrefixOracle
from bench.progress import Progress
from bench.rawsse import RawSseClient
from bench.runner import LoadPlan, PickUrl, run_load
from bench.sample import Sample
from bench.stats import Slo
from bench.summary import RunResult, scale_sample, summarize
from bench.workload import RequestSpec, Workload, with_priorities


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """The load as the user states it (simulated units when `time_scale` ≠ 1)."""

    arrival: str = "poisson"
    requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    warmup_s: float = 0.0
    burstiness: float = 1.0
    spike_factor: float = 3.0
    spike_start_s: float = 10.0
    spike_duration_s: float = 10.0
    trace_times_s: tuple[float, ...] = ()
    seed: int = 0

    @property
    def level_kind(self) -> str:
        return {"closed": "concurrency", "trace": "trace"}.get(self.arrival, "rate")

    def plan(self, level: float, time_scale: float) -> LoadPlan:
        k = time_scale
        arrivals = make_arrivals(
            self.arrival,
            level if self.arrival == "closed" else level * k,
            burstiness=self.burstiness,
            spike_factor=self.spike_factor,
            spike_start_s=self.spike_start_s / k,
            spike_duration_s=self.spike_duration_s / k,
            trace_times_s=tuple(t / k for t in self.trace_times_s),
        )
        return LoadPlan(
            arrivals=arrivals,
            requests=self.requests,
            duration_s=self.duration_s / k if self.duration_s is not None else None,
            warmup_requests=self.warmup_requests,
            warmup_s=self.warmup_s / k,
            seed=self.seed,
        )


@dataclass(frozen=True, slots=True)
class Experiment:
    """Everything but the target and the load level."""

    workload: Workload
    load: LoadSpec
    client: ClientOptions
    slo: Slo
    priority_mix: dict[str, float] = field(default_factory=dict)
    api: str = "chat"
    client_kind: str = "httpx"
    time_scale: float = 1.0
    sample_interval_s: float = 0.5
    progress: bool = True
    schedule: tuple[FaultEvent, ...] = ()
    poison: Poison | None = None

    @property
    def with_faults(self) -> bool:
        return bool(self.schedule) or (self.poison is not None and self.poison.fraction > 0)

    def specs(self) -> Iterator[RequestSpec]:
        seed = self.load.seed
        specs = with_priorities(self.workload.requests(seed), self.priority_mix, seed)
        specs = with_poison(specs, self.poison, seed, skip=self.load.warmup_requests)
        if self.api == "completions":
            return (replace(s, prompt=s.prompt_text(), messages=()) for s in specs)
        return specs

    def params(self) -> dict[str, Any]:
        return {
            "workload": self.workload.describe(),
            "load": {k: v for k, v in _fields(self.load).items() if k != "trace_times_s"},
            "stream": self.client.stream,
            "client": self.client_kind,
            "api": self.api,
            "slo_ms": self.slo.to_ms(),
            "priority_mix": self.priority_mix,
            "time_scale": self.time_scale,
            **({"faults": [e.describe() for e in self.schedule]} if self.schedule else {}),
            **({"poison": self.poison.describe()} if self.poison is not None else {}),
        }


class RoundRobinUrls:
    """`pick(spec)` returns the URLs in turn, whatever the request (an L4 load balancer's rotation)."""

    def __init__(self, urls: list[str]) -> None:
        if not urls:
            raise ValueError("round robin needs at least one URL")
        self.urls = [url.rstrip("/") for url in urls]
        self._next = 0

    def pick(self, spec: RequestSpec) -> str:
        url = self.urls[self._next]
        self._next = (self._next + 1) % len(self.urls)
        return url


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go: a URL (gateway, engine or any OpenAI-compatible service) plus `also_urls`,
    further instances of the same service (requests go round robin over `urls`), or the prefix
    oracle over `engines`; `engines` (replica id → URL) are also scraped for /metrics."""

    url: str | None
    engines: dict[str, str] = field(default_factory=dict)
    oracle: bool = False
    fleet: FleetControl | None = None
    also_urls: tuple[str, ...] = ()
    replica_ids: tuple[str, ...] = ()
    """Engines that answer clients, for requests per replica (default: all of `engines`; a
    disaggregated fleet's decode engines)."""

    @property
    def urls(self) -> list[str]:
        """Every instance the load goes to (none for the oracle without a URL)."""
        return [u for u in (self.url, *self.also_urls) if u is not None]

    def pick_url(self) -> PickUrl:
        if self.oracle:
            return PrefixOracle(list(self.engines.values())).pick
        if self.url is None:
            raise ValueError("a target needs a URL unless it is the oracle")
        return RoundRobinUrls(self.urls).pick


async def _run(
    label: str, exp: Experiment, target: Target, plan: LoadPlan
) -> tuple[list[Sample], Any, list[dict[str, Any]] | None]:
    client: Client = RawSseClient(exp.client) if exp.client_kind == "raw" else BenchClient(exp.client)
    sampler = (
        EngineSampler(
            target.engines, exp.sample_interval_s, gateway_urls=target.urls, watch_breakers=exp.with_faults
        )
        if target.engines
        else None
    )
    if exp.schedule and target.fleet is None:
        raise ValueError("a fault schedule needs the local fleet (no --url)")
    faults = FaultRunner(exp.schedule, target.fleet) if exp.schedule and target.fleet is not None else None
    progress = Progress(label, plan.requests, duration_s=plan.duration_s, enabled=exp.progress)
    try:
        record = await run_load(
            plan,
            exp.specs(),
            client,
            target.pick_url(),
            sampler=sampler,
            progress=progress,
            label_replicas=target.oracle,
            on_measured=faults.start if faults is not None else None,
        )
    finally:
        log = await faults.stop() if faults is not None else None
        await client.aclose()
    return record.samples, sampler, log


def run_experiment(label: str, level: float | None, exp: Experiment, target: Target) -> RunResult:
    """Run one experiment (its own event loop) and summarise it."""
    k = exp.time_scale
    plan = exp.load.plan(level if level is not None else 1.0, k)
    with asyncio.Runner(loop_factory=_client_loop_factory()) as runner:
        samples, sampler, fault_log = runner.run(_run(label, exp, target, plan))
    measured = [s for s in samples if not s.warmup]
    replica_ids = list(target.replica_ids or target.engines)
    summary = summarize(measured, exp.slo, replica_ids=replica_ids, time_scale=k)
    summary["answers"] = answers([scale_sample(s, k) for s in measured], exp.slo, exp.client.stream)
    if fault_log is not None:
        summary["faults"] = event_effects(fault_log, samples, exp.client.stream)
    series: LoadSeries | None = None
    if sampler is not None:
        window = summary["window_s"]
        series = LoadSeries([(t * k, r, snap) for t, r, snap in sampler.series.points])
        sampler.series = series
        if sampler.breakers is not None:
            sampler.breakers = BreakerLog([(t * k, states) for t, states in sampler.breakers.points])
        summary["engine"] = sampler.summary((window[0], window[1]))
    shown: str | list[str] = (target.urls if len(target.urls) > 1 else target.url) or "oracle"
    params = {**exp.params(), "arrivals": describe(plan.arrivals), "target": shown}
    if isinstance(plan.arrivals, ClosedLoop):
        params["concurrency"] = plan.arrivals.concurrency
    return RunResult(label, level, exp.load.level_kind, samples, summary, params, series, time_scale=k)


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


def _client_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (it comes with `uvicorn[standard]` on Linux), as in the gateway and the
    engines: the client handles thousands of SSE frames per second, and on the default loop its own
    per-event overhead shows up as latency it attributes to the server (a refusal's p50 reads higher on
    the default loop against the same gateway; docs/bench-log/2026-12-05-rounds.md, "Early refusal by
    class"). None: the default loop."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
