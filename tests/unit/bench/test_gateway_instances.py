"""Several gateway instances (`--gateway-instances N`): ports and names of the fleet, round robin over the
instances (conversations stay in order), and the gateways' /metrics summed over instances."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.arrivals import Constant
from bench.client import BenchClient, ClientOptions
from bench.engine_metrics import EngineSampler
from bench.execute import RoundRobinUrls, Target
from bench.fleet import Fleet
from bench.fleet_config import EngineOptions
from bench.gateway_metrics import parse_breakers, parse_requests, sum_counters
from bench.gateway_rejections import sum_histograms
from bench.report import render_markdown
from bench.runner import LoadPlan, run_load
from bench.sample import Sample
from bench.stats import Slo
from bench.summary import RunResult, summarize
from bench.workload import RequestSpec


def test_fleet_ports_and_names_with_three_gateway_instances() -> None:
    fleet = Fleet(2, EngineOptions(), base_port=9000, gateways=3)
    assert fleet.gateway_ports == [9000, 9001, 9002]
    assert fleet.engine_ports == [9003, 9004], "engines after the last gateway"
    assert fleet.gateway_urls == [f"http://127.0.0.1:{p}" for p in (9000, 9001, 9002)]
    assert fleet.url == "http://127.0.0.1:9000"
    assert [fleet.gateway_name(j) for j in range(3)] == ["gateway-0", "gateway-1", "gateway-2"]
    single = Fleet(2, EngineOptions(), base_port=9000)
    assert (single.gateway_ports, single.engine_ports) == ([9000], [9001, 9002]), "one gateway: as before"
    assert single.gateway_name(0) == "gateway" and single.gateway_pid is None
    assert Fleet(1, EngineOptions(), gateway=None, gateways=3).gateway_urls == []
    with pytest.raises(ValueError, match="gateway instances"):
        Fleet(1, EngineOptions(), gateways=0)


def test_round_robin_and_the_target_urls() -> None:
    spec = RequestSpec(messages=(("user", "q"),), max_tokens=1)
    rr = RoundRobinUrls(["http://a/", "http://b", "http://c"])
    assert [rr.pick(spec) for _ in range(7)] == ["http://a", "http://b", "http://c"] * 2 + ["http://a"]
    with pytest.raises(ValueError):
        RoundRobinUrls([])
    target = Target("http://a", also_urls=("http://b",))
    assert target.urls == ["http://a", "http://b"]
    pick = target.pick_url()
    assert [pick(spec) for _ in range(3)] == ["http://a", "http://b", "http://a"]
    only = Target("http://a/").pick_url()
    assert {only(spec) for _ in range(3)} == {"http://a"}
    assert Target(None, engines={"e": "http://e"}, oracle=True).urls == []


def _specs(session: str) -> Iterator[RequestSpec]:
    return (
        RequestSpec(messages=(("user", f"q{i}"),), max_tokens=2, session_id=session)
        for i in itertools.count()
    )


async def test_turns_of_a_conversation_stay_in_order_across_instances() -> None:
    """One session, two instances: turns alternate between the instances, never overlap, keep order."""
    seen: list[tuple[str, str]] = []
    active = 0
    overlap = False

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal active, overlap
        active += 1
        overlap = overlap or active > 1
        seen.append((request.url.host, json.loads(request.content)["messages"][0]["content"]))
        await asyncio.sleep(0.005)
        active -= 1
        return httpx.Response(200, json={"usage": {"completion_tokens": 2}})

    client = BenchClient(ClientOptions(model="m", stream=False), transport=httpx.MockTransport(handler))
    pick = Target("http://g0", also_urls=("http://g1",)).pick_url()
    record = await run_load(LoadPlan(Constant(1000.0), requests=6), _specs("c1"), client, pick)
    await client.aclose()
    assert all(s.ok for s in record.samples) and not overlap
    assert seen == [(f"g{i % 2}", f"q{i}") for i in range(6)]


def _gateway_text(requests: float, rejected: dict[str, float], retries: float, open_replica: str) -> str:
    bucket = "llm_gateway_rejection_duration_seconds_bucket"
    lines = [
        f'llm_gateway_requests_total{{model="m",outcome="success"}} {requests}',
        f'llm_gateway_requests_total{{model="m",outcome="rejected"}} {rejected["+Inf"]}',
        f'llm_gateway_retries_total{{reason="connect"}} {retries}',
        f'llm_gateway_breaker_state{{replica="{open_replica}"}} 2',
    ]
    lines += [f'{bucket}{{le="{le}",reason="queue_full"}} {n}' for le, n in rejected.items()]
    return "\n".join(lines) + "\n"


def test_sums_over_instances_and_breakers_per_instance() -> None:
    a = {"queue_full": [(0.005, 2.0), (math.inf, 3.0)]}
    b = {"queue_full": [(0.005, 1.0), (math.inf, 1.0)], "draining": [(math.inf, 4.0)]}
    assert sum_histograms([a, b]) == {
        "queue_full": [(0.005, 3.0), (math.inf, 4.0)],
        "draining": [(math.inf, 4.0)],
    }
    assert sum_histograms([a]) == a
    assert sum_counters([{"retries": {"x": 1.0}}, {"retries": {"x": 2.0, "y": 1.0}}, {}]) == {
        "retries": {"x": 3.0, "y": 1.0}
    }
    text = _gateway_text(10, {"0.005": 1, "+Inf": 2}, 0, "e:1")
    assert parse_requests(text) == 12.0
    assert parse_requests('llm_gateway_requests_total{model="m" 1') is None
    assert parse_breakers(text) == {"e:1": 2.0}
    assert parse_breakers(text, instance=1) == {"e:1@1": 2.0}


async def test_sampler_sums_the_gateway_instances_and_counts_requests_per_instance() -> None:
    g0 = [
        _gateway_text(0, {"0.005": 0, "+Inf": 0}, 1, "e:1"),
        _gateway_text(30, {"0.005": 4, "+Inf": 5}, 3, "e:1"),
    ]
    g1 = [
        _gateway_text(5, {"0.005": 1, "+Inf": 1}, 0, "e:2"),
        _gateway_text(25, {"0.005": 1, "+Inf": 3}, 2, "e:2"),
    ]
    scripts = {"g0": iter(g0), "g1": iter(g1)}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=next(scripts[request.url.host]))

    sampler = EngineSampler(
        {}, gateway_urls=["http://g0", "http://g1/"], transport=httpx.MockTransport(handler)
    )
    await sampler.baseline()
    await sampler.finish()
    summary = sampler.summary((0.0, 1.0))
    # g0: 30 successes + 5 rejected from 0; g1: (25 + 3) − (5 + 1)
    assert summary["gateway_instances"] == {"http://g0": 35, "http://g1": 22}
    rejections = summary["gateway_rejections"]["queue_full"]
    assert rejections["count"] == 7 and rejections["within_5ms_ratio"] == pytest.approx(4 / 7)
    assert summary["gateway"]["counters"]["retries"] == {"connect": 4}


async def test_sampler_gives_no_gateway_figures_when_an_instance_does_not_answer() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "g1":
            return httpx.Response(503)
        return httpx.Response(200, text=_gateway_text(1, {"+Inf": 0}, 0, "e:1"))

    sampler = EngineSampler(
        {}, gateway_urls=["http://g0", "http://g1"], transport=httpx.MockTransport(handler)
    )
    await sampler.baseline()
    await sampler.finish()
    summary = sampler.summary((0.0, 1.0))
    assert summary["gateway_instances"] is None and summary["gateway_rejections"] is None
    assert summary["gateway"] is None


def test_report_lists_requests_per_instance_only_with_several() -> None:
    def run(counts: dict[str, int]) -> RunResult:
        summary = _minimal_summary()
        summary["engine"] = {"gateway_instances": counts}
        return RunResult("sticky", 16.0, "rate", [], summary, {})

    several = render_markdown("t", {}, [run({"http://127.0.0.1:1": 40, "http://127.0.0.1:2": 41})])
    assert "Requests per gateway instance" in several
    assert "- sticky @ 16.00: 127.0.0.1:1 40, 127.0.0.1:2 41" in several
    assert "Requests per gateway instance" not in render_markdown("t", {}, [run({"http://127.0.0.1:1": 81})])


def _minimal_summary() -> dict[str, Any]:
    sample = Sample(0, 0.0, 0.0, 200, True, 1.0, 0.1, 0.01, 10, replica="a:1")
    return summarize([sample], Slo(ttft_s=1.0, tpot_s=0.1))
