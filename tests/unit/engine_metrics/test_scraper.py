"""EngineScraper against real HTTP servers on 127.0.0.1 (asyncio.start_server), with a fake clock for
ages and staleness."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import fields

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.config.scrape_settings import OnStale, ScrapeSettings
from gateway.upstream.engine_metrics import ADAPTERS
from gateway.upstream.replica import Replica
from gateway.upstream.scrape_metrics import ScrapeMetrics
from gateway.upstream.scraper import EngineScraper, ScrapeTarget
from mock_engine.core import EngineStats
from mock_engine.metrics_text import render_metrics
from router.types import EngineLoad
from tests.servers import start_mock_engine
from tests.unit.engine_metrics import fixtures
from tests.unit.engine_metrics.http_server import (
    MODEL,
    STATS,
    FakeClock,
    MetricsServer,
    Target,
    closed_port_url,
)
from tests.waiting import eventually

SETTINGS = ScrapeSettings(interval_s=0.5, timeout_s=0.2)  # stale after 1.5 s


@pytest.fixture
async def server() -> AsyncIterator[MetricsServer]:
    srv = await MetricsServer().start()
    yield srv
    await srv.stop()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as c:
        yield c


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> ScrapeMetrics:
    return ScrapeMetrics(
        errors=Counter("llm_gateway_scrape_errors", "x", ["replica", "reason"], registry=registry),
        running=Gauge("llm_gateway_replica_engine_running", "x", ["replica"], registry=registry),
        waiting=Gauge("llm_gateway_replica_engine_waiting", "x", ["replica"], registry=registry),
        kv_usage_ratio=Gauge("llm_gateway_replica_kv_usage_ratio", "x", ["replica"], registry=registry),
        prefix_cache_hit_ratio=Gauge(
            "llm_gateway_replica_prefix_cache_hit_ratio", "x", ["replica"], registry=registry
        ),
        learned_cap=Gauge("llm_gateway_learned_max_concurrency", "x", ["replica"], registry=registry),
    )


def errors(registry: CollectorRegistry, reason: str, replica: str = "r1") -> float:
    value = registry.get_sample_value(
        "llm_gateway_scrape_errors_total", {"replica": replica, "reason": reason}
    )
    return value or 0.0


def gauge(registry: CollectorRegistry, name: str, replica: str = "r1") -> float | None:
    return registry.get_sample_value(f"llm_gateway_{name}", {"replica": replica})


def make_scraper(
    targets: list[Target],
    client: httpx.AsyncClient,
    clock: FakeClock,
    *,
    metrics: ScrapeMetrics | None = None,
    settings: ScrapeSettings = SETTINGS,
    flavour: str = "vllm",
    on_capacity: Callable[[], None] | None = None,
) -> EngineScraper:
    return EngineScraper(
        settings,
        ADAPTERS[flavour],
        lambda: targets,
        client,
        model=MODEL,
        metrics=metrics,
        clock=clock,
        rng=random.Random(7),
        on_capacity=on_capacity,
    )


async def test_each_fresh_sample_reaches_its_target_and_a_grown_cap_wakes_admission(
    server: MetricsServer, client: httpx.AsyncClient, metrics: ScrapeMetrics, registry: CollectorRegistry
) -> None:
    woken: list[int] = []
    same, grown = Target("r1", server.url), Target("r2", server.url, grows=True, learned_cap=12)
    scraper = make_scraper(
        [same, grown], client, FakeClock(), metrics=metrics, on_capacity=lambda: woken.append(1)
    )
    await scraper.poll_once()
    assert len(same.sampled) == len(grown.sampled) == 1 and same.sampled[0] is not None
    assert woken == [1], "only the target whose cap grew wakes admission"
    assert gauge(registry, "learned_max_concurrency", "r2") == 12
    assert gauge(registry, "learned_max_concurrency", "r1") == 0


async def test_a_fresh_sample_is_published_and_exported(
    server: MetricsServer, client: httpx.AsyncClient, metrics: ScrapeMetrics, registry: CollectorRegistry
) -> None:
    clock = FakeClock()
    target = Target("r1", server.url)
    await make_scraper([target], client, clock, metrics=metrics).poll_once()
    assert target.engine == EngineLoad(
        running=3.0, waiting=80.0, kv_usage_ratio=0.5, prefix_cache_hit_ratio=0.25, age_s=0.0, stale=False
    )
    assert server.paths == ["/metrics"]
    assert gauge(registry, "replica_engine_running") == 3.0
    assert gauge(registry, "replica_engine_waiting") == 80.0
    assert gauge(registry, "replica_kv_usage_ratio") == 0.5
    assert gauge(registry, "replica_prefix_cache_hit_ratio") == 0.25


async def test_a_failed_scrape_keeps_the_last_sample_until_the_bound_then_saturates(
    server, client, metrics, registry
):
    clock = FakeClock()
    target = Target("r1", server.url)
    scraper = make_scraper([target], client, clock, metrics=metrics)
    await scraper.poll_once()
    server.status = 500

    clock.now_s += 1.0
    await scraper.poll_once()
    assert target.engine is not None and target.engine.kv_usage_ratio == 0.5  # still the last good sample
    assert target.engine.age_s == pytest.approx(1.0)
    assert errors(registry, "http_status") == 1
    assert errors(registry, "stale") == 0

    clock.now_s += 0.75  # 1.75 s > stale bound 1.5 s
    await scraper.poll_once()
    assert target.engine == EngineLoad(running=3.0, waiting=80.0, kv_usage_ratio=1.0, age_s=1.75)
    assert errors(registry, "stale") == 1
    assert gauge(registry, "replica_engine_running") is None  # an unknown value is not exported

    clock.now_s += 0.5
    await scraper.poll_once()
    assert errors(registry, "stale") == 1  # counted once per transition
    assert errors(registry, "http_status") == 3


async def test_saturated_waiting_is_at_least_the_configured_penalty(
    server: MetricsServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    server.body = render_metrics(MODEL, EngineStats(2, 1, 0.1, 0, 0, 0, 0, 0))
    target = Target("r1", server.url)
    scraper = make_scraper([target], client, clock)
    await scraper.poll_once()
    server.status = 503
    clock.now_s += 2.0
    await scraper.poll_once()
    assert target.engine is not None
    assert (target.engine.running, target.engine.waiting, target.engine.kv_usage_ratio) == (2.0, 64.0, 1.0)


async def test_ignore_policy_drops_the_engine_signal_after_the_bound(
    server: MetricsServer, client: httpx.AsyncClient, metrics: ScrapeMetrics, registry: CollectorRegistry
) -> None:
    clock = FakeClock()
    target = Target("r1", server.url)
    settings = ScrapeSettings(interval_s=0.5, timeout_s=0.2, stale_after_s=2.0, on_stale=OnStale.IGNORE)
    scraper = make_scraper([target], client, clock, metrics=metrics, settings=settings)
    await scraper.poll_once()
    server.body = b"vllm:num_requests_running{broken 1\nvllm:num_requests_waiting 0\n"
    clock.now_s += 2.0
    await scraper.poll_once()
    assert target.engine is not None and target.engine.age_s == pytest.approx(2.0)
    clock.now_s += 0.1
    await scraper.poll_once()
    assert target.engine is None
    assert errors(registry, "parse") == 2
    assert errors(registry, "stale") == 1
    assert gauge(registry, "replica_engine_waiting") is None


async def test_recovery_publishes_fresh_samples_and_rearms_the_stale_count(
    server: MetricsServer, client: httpx.AsyncClient, metrics: ScrapeMetrics, registry: CollectorRegistry
) -> None:
    clock = FakeClock()
    target = Target("r1", server.url)
    scraper = make_scraper([target], client, clock, metrics=metrics)
    server.hang_up = True
    await scraper.poll_once()
    assert target.engine is None  # nothing known yet, within the bound
    clock.now_s += 2.0  # never answered within the bound: saturated with nothing known
    await scraper.poll_once()
    assert target.engine == EngineLoad(running=0.0, waiting=64.0, kv_usage_ratio=1.0, age_s=2.0)
    assert errors(registry, "transport") == 2

    server.hang_up = False
    await scraper.poll_once()
    assert target.engine is not None and target.engine.kv_usage_ratio == 0.5 and target.engine.age_s == 0.0
    assert gauge(registry, "replica_engine_running") == 3.0

    server.status = 404
    clock.now_s += 5.0
    await scraper.poll_once()
    assert errors(registry, "stale") == 2


@pytest.mark.parametrize(
    "case",
    [
        (lambda s: setattr(s, "status", 404), "http_status"),
        (lambda s: setattr(s, "body", b'vllm:num_requests_running{model_name="m} 1\n'), "parse"),
        (lambda s: setattr(s, "body", fixtures.TGI.encode()), "missing_metrics"),
        (lambda s: setattr(s, "delay_s", 1.0), "timeout"),
        (lambda s: setattr(s, "hang_up", True), "transport"),
        (None, "connect"),
    ],
)
async def test_each_failure_is_counted_by_reason(
    server: MetricsServer,
    client: httpx.AsyncClient,
    metrics: ScrapeMetrics,
    registry: CollectorRegistry,
    case: tuple[Callable[[MetricsServer], None] | None, str],
) -> None:
    setup, reason = case
    clock = FakeClock()
    url = server.url
    if setup is None:
        url = closed_port_url()
    else:
        setup(server)
    target = Target("r1", url)
    started = asyncio.get_running_loop().time()
    await make_scraper([target], client, clock, metrics=metrics).poll_once()
    assert asyncio.get_running_loop().time() - started < 0.9  # bounded by timeout_s, not the server
    assert errors(registry, reason) == 1
    assert target.engine is None  # nothing known yet, and within the bound


async def test_hit_ratio_comes_from_counter_deltas_between_polls(
    server: MetricsServer, client: httpx.AsyncClient
) -> None:
    clock = FakeClock()
    target = Target("r1", server.url)
    scraper = make_scraper([target], client, clock)
    await scraper.poll_once()
    server.body = render_metrics(MODEL, EngineStats(3, 80, 0.5, 1400, 550, 900, 5000, 0))
    clock.now_s += 0.5
    await scraper.poll_once()
    assert target.engine is not None and target.engine.prefix_cache_hit_ratio == pytest.approx(300 / 400)


async def test_other_flavours_are_read_with_their_adapter(
    server: MetricsServer, client: httpx.AsyncClient
) -> None:
    server.body = render_metrics(MODEL, STATS, flavour="llamacpp")
    target = Target("r1", server.url)
    await make_scraper([target], client, FakeClock(), flavour="llamacpp").poll_once()
    assert target.engine is not None and (target.engine.running, target.engine.waiting) == (3.0, 80.0)


async def test_removed_replicas_are_forgotten_and_their_gauges_removed(
    server: MetricsServer, client: httpx.AsyncClient, metrics: ScrapeMetrics, registry: CollectorRegistry
) -> None:
    targets = [Target("r1", server.url), Target("r2", server.url)]
    scraper = make_scraper(targets, client, FakeClock(), metrics=metrics)
    await scraper.poll_once()
    assert gauge(registry, "replica_engine_running", "r2") == 3.0
    targets.pop()
    await scraper.poll_once()
    assert gauge(registry, "replica_engine_running", "r2") is None
    assert len(server.paths) == 3


def as_target(replica: Replica) -> ScrapeTarget:
    return replica  # type-checked by mypy: the registry's Replica fits the ScrapeTarget protocol


def test_a_registry_replica_is_a_scrape_target() -> None:
    assert {"replica_id", "url", "engine"} <= {f.name for f in fields(Replica)}
    assert as_target is not None


async def test_the_loop_polls_each_replica_on_its_own_phase_and_stops_cleanly(
    client: httpx.AsyncClient,
) -> None:
    servers = [await MetricsServer().start() for _ in range(2)]
    targets = [Target(f"r{i}", s.url) for i, s in enumerate(servers)]
    settings = ScrapeSettings(interval_s=0.05, timeout_s=0.04)
    scraper = EngineScraper(settings, ADAPTERS["vllm"], lambda: targets, client, rng=random.Random(3))
    try:
        scraper.start()
        scraper.start()  # idempotent
        await eventually(lambda: all(len(s.paths) >= 3 for s in servers), what="3 polls of each replica")
        assert all(t.engine is not None and not t.engine.stale for t in targets)
        phases = [state.next_due_s % settings.interval_s for state in scraper._states.values()]
        assert abs(phases[0] - phases[1]) > 1e-6  # not in lockstep
        await scraper.stop()
        assert not scraper.running
        polled = [len(s.paths) for s in servers]
        # Deliberate idle period, the behaviour under test: with the servers still up, more than two
        # scrape intervals pass and no poll arrives (there is no event to wait for when nothing happens).
        await asyncio.sleep(0.12)
        assert [len(s.paths) for s in servers] == polled  # nothing polls after stop()
    finally:
        await scraper.stop()
        for s in servers:
            await s.stop()
    leftovers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not [t for t in leftovers if not t.done()]


async def test_stop_cancels_a_scrape_in_flight(server: MetricsServer, client: httpx.AsyncClient) -> None:
    server.delay_s = 5.0
    settings = ScrapeSettings(interval_s=2.0, timeout_s=1.9)
    scraper = EngineScraper(
        settings, ADAPTERS["vllm"], lambda: [Target("r1", server.url)], client, rng=random.Random(1)
    )  # phase ≈ 0.27 s
    scraper.start()
    await eventually(lambda: bool(server.paths), what="a scrape is waiting on the slow server")
    started = asyncio.get_running_loop().time()
    await scraper.stop()
    assert asyncio.get_running_loop().time() - started < 0.5  # cancelled, not waited out


@pytest.fixture
def mock_engine() -> Iterator[str]:
    engine = start_mock_engine(model=MODEL)
    yield engine.url
    engine.stop()


async def test_the_mock_engine_server_is_scraped_with_the_vllm_adapter(
    mock_engine: str, client: httpx.AsyncClient
) -> None:
    target = Target("mock", mock_engine)
    await make_scraper([target], client, FakeClock()).poll_once()
    assert target.engine is not None
    assert (target.engine.running, target.engine.waiting, target.engine.stale) == (0.0, 0.0, False)
