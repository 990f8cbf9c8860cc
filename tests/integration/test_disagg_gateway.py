"""A disaggregated pool through a real gateway in front of real prefill and decode mock engines (vLLM's
kv_transfer_params legs and SGLang's bootstrap legs), with the official `openai` client.

The engines (`tests.disagg_fleet`) check every leg's fields and pair the legs, so a served request proves
the wire shapes and the pairing; the text is the aggregated engine's for the same prompt and seed, so
the tests compare it with that.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.config.settings import ConfigError, parse_settings
from gateway.upstream.registry import replica_id_for
from mock_engine.disagg_params import Protocol, Role
from mock_engine.faults import FaultSettings
from tests.disagg_fleet import aggregated_answer, disagg_engine, disagg_pool
from tests.servers import (
    ServerThread,
    free_port,
    gateway_settings,
    start_gateway,
    wait_until,
)

MODEL = "m"
PROMPT = "the quick brown fox jumps over the lazy dog " * 3


def _engine(role: Role, protocol: Protocol, faults: FaultSettings | None = None) -> ServerThread:
    return disagg_engine(MODEL, role, protocol, faults)


@dataclass
class DisaggFleet:
    gateway: ServerThread
    prefill: list[ServerThread]
    decode: list[ServerThread]

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gateway.url + "/v1", api_key="unused", max_retries=0, timeout=20)

    def stats(self, server: ServerThread) -> dict[str, int]:
        return dict(httpx.get(f"{server.url}/mock/stats").json())

    def idle(self) -> bool:
        """Nothing in flight: the gateway's slots on both sets, and the engines' requests."""
        registry = self.gateway.app.state.registry
        replicas = [
            *registry.pools[MODEL].replicas.values(),
            *registry.pools[f"{MODEL}/prefill"].replicas.values(),
        ]
        engines = [s for s in (*self.prefill, *self.decode) if s.server.started and not s.server.should_exit]
        return (
            registry.total_inflight() == 0
            and all(r.inflight_requests == 0 for r in replicas)
            and all(self.stats(s)["active"] == 0 for s in engines)
        )

    def stop(self) -> None:
        self.gateway.stop()
        for server in (*self.prefill, *self.decode):
            if not server.server.should_exit:
                server.stop()


def _fleet(
    protocol: Protocol,
    *,
    prefill: list[ServerThread],
    decode: list[ServerThread],
    extra_prefill_urls: tuple[str, ...] = (),
    prefill_policy: str | None = None,
    decode_policy: str | None = None,
    decode_cap: int | None = None,
) -> DisaggFleet:
    pool = disagg_pool(
        MODEL,
        protocol,
        [*extra_prefill_urls, *(s.url for s in prefill)],
        [s.url for s in decode],
        prefill_policy=prefill_policy,
        decode_policy=decode_policy,
        decode_cap=decode_cap,
    )
    gateway = start_gateway(gateway_settings([pool]))
    return DisaggFleet(gateway, prefill, decode)


@pytest.fixture(params=[Protocol.VLLM, Protocol.SGLANG], ids=str)
def pair_fleet(request: pytest.FixtureRequest) -> Iterator[DisaggFleet]:
    protocol: Protocol = request.param
    fleet = _fleet(
        protocol, prefill=[_engine(Role.PREFILL, protocol)], decode=[_engine(Role.DECODE, protocol)]
    )
    yield fleet
    fleet.stop()


def _aggregated(body: dict[str, Any], path: str) -> dict[str, Any]:
    return aggregated_answer(MODEL, body, path)


def _route(headers: httpx.Headers) -> dict[str, str]:
    return dict(part.split("=", 1) for part in headers["x-gateway-route"].split("; "))


def test_both_protocols_serve_streamed_and_not(pair_fleet: DisaggFleet) -> None:
    client = pair_fleet.client
    prefill_id, decode_id = (replica_id_for(s[0].url) for s in (pair_fleet.prefill, pair_fleet.decode))
    messages = [{"role": "user", "content": PROMPT}]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=7, seed=3
    )
    answer = raw.parse()
    expected = _aggregated({"messages": messages, "max_tokens": 7, "seed": 3}, "/v1/chat/completions")
    assert answer.choices[0].message.content == expected["choices"][0]["message"]["content"]
    assert (
        answer.usage is not None and answer.usage.completion_tokens == 7
    )  # the decode's, not the prefill's 1
    assert raw.headers["x-gateway-replica"] == decode_id
    route = _route(raw.headers)
    assert (route["prefill"], route["decode"], route["prefill_policy"]) == (
        prefill_id,
        decode_id,
        "prefix-index",
    )
    assert route["policy"] == "least-load"

    streamed = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=7,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(streamed)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected["choices"][0]["message"]["content"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7

    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, seed=1, stream=True)
    streamed_text = "".join(c.choices[0].text for c in completion)
    plain = _aggregated({"prompt": PROMPT, "max_tokens": 5, "seed": 1}, "/v1/completions")
    assert streamed_text == plain["choices"][0]["text"]

    prefill_stats, decode_stats = (
        pair_fleet.stats(pair_fleet.prefill[0]),
        pair_fleet.stats(pair_fleet.decode[0]),
    )
    assert decode_stats["kv_transfers_received"] == 3 and decode_stats["kv_transfer_errors"] == 0
    assert prefill_stats["kv_transfers_completed"] == 3
    assert prefill_stats["started"] == 3 and decode_stats["started"] == 3
    assert wait_until(pair_fleet.idle)
    assert pair_fleet.stats(pair_fleet.prefill[0]).get("kv_transfers_pending", 0) == 0


def test_models_lists_the_pool_not_its_prefill_set(pair_fleet: DisaggFleet) -> None:
    assert [m.id for m in pair_fleet.client.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError):
        pair_fleet.client.completions.create(model=f"{MODEL}/prefill", prompt="x", max_tokens=1)


@pytest.mark.parametrize("protocol", [Protocol.VLLM, Protocol.SGLANG], ids=str)
def test_a_dead_prefill_replica_is_charged_and_another_serves(protocol: Protocol) -> None:
    live = _engine(Role.PREFILL, protocol)
    dead_url = f"http://127.0.0.1:{free_port()}"
    fleet = _fleet(
        protocol,
        prefill=[live],
        decode=[_engine(Role.DECODE, protocol)],
        extra_prefill_urls=(dead_url,),
        prefill_policy="round-robin",
    )
    try:
        for n in range(4):
            raw = fleet.client.completions.with_raw_response.create(
                model=MODEL, prompt=f"{PROMPT} {n}", max_tokens=3, stream=n % 2 == 0
            )
            assert raw.status_code == 200
            assert _route(raw.headers)["prefill"] == replica_id_for(live.url)
            raw.parse()
        metrics = fleet.gateway.app.state.metrics
        charged = metrics.upstream_failures_total.labels(
            f"{MODEL}/prefill", "replica", "connect"
        )._value.get()
        assert charged >= 1, "the connect failure is the prefill replica's, counted under the prefill set"
        assert metrics.upstream_failures_total.labels(MODEL, "replica", "connect")._value.get() == 0
        assert metrics.retries_total.labels("connect")._value.get() == charged
        dead = fleet.gateway.app.state.registry.pools[f"{MODEL}/prefill"].replicas[replica_id_for(dead_url)]
        assert dead.consecutive_connect_failures >= 1
        assert wait_until(fleet.idle)
    finally:
        fleet.stop()


@pytest.mark.parametrize("protocol", [Protocol.VLLM, Protocol.SGLANG], ids=str)
def test_a_decode_failing_before_the_first_token_gets_a_new_prefill(protocol: Protocol) -> None:
    prefill = _engine(Role.PREFILL, protocol)
    broken = _engine(Role.DECODE, protocol, FaultSettings(crash_after_tokens=0))  # reset before any token
    good = _engine(Role.DECODE, protocol)
    fleet = _fleet(protocol, prefill=[prefill], decode=[broken, good], decode_policy="round-robin")
    try:
        for n in range(4):
            raw = fleet.client.completions.with_raw_response.create(
                model=MODEL, prompt=f"{PROMPT} {n}", max_tokens=4, seed=n, stream=n < 3
            )
            assert raw.status_code == 200
            assert raw.headers["x-gateway-replica"] == replica_id_for(good.url)
            raw.parse()
        crashed = fleet.stats(broken)["crashed_injected"]
        assert crashed >= 1, "round-robin sent at least one decode leg to the broken replica"
        # every decode leg that reached the broken replica needed a prefill of its own: the KV is gone
        assert fleet.stats(prefill)["kv_transfers_completed"] == 4 + crashed
        assert fleet.stats(good)["kv_transfers_received"] == 4
        metrics = fleet.gateway.app.state.metrics
        assert metrics.upstream_failures_total.labels(MODEL, "replica", "stream_broken")._value.get() >= 1
        assert metrics.retries_total.labels("stream_broken")._value.get() >= 1
        for kind in ("connect", "stream_broken", "status_5xx"):
            assert (
                metrics.upstream_failures_total.labels(f"{MODEL}/prefill", "replica", kind)._value.get() == 0
            )
        assert wait_until(fleet.idle)
    finally:
        fleet.stop()


def test_the_first_token_deadline_spans_both_hops() -> None:
    """Prefill 0.3 s + decode 0.3 s: each leg alone is within a 0.45 s first-token deadline, the pair
    is not, so the request fails with the first-token timeout instead of being served late."""
    protocol = Protocol.VLLM
    prefill = _engine(Role.PREFILL, protocol, FaultSettings(slow_first_token_ms=300))
    decode = _engine(Role.DECODE, protocol, FaultSettings(slow_first_token_ms=300))
    fleet = _fleet(protocol, prefill=[prefill], decode=[decode])
    try:
        client = fleet.client.with_options(default_headers={"x-gateway-ttft-timeout-ms": "450"})
        with pytest.raises(openai.APIStatusError) as failed:
            list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, stream=True))
        assert failed.value.status_code == 504
        assert fleet.stats(decode)["slowed_injected"] >= 1, "the decode leg was sent: the prefill was in time"
        assert wait_until(fleet.idle, timeout_s=5)
    finally:
        fleet.stop()


@pytest.mark.parametrize(
    ("pool", "named"),
    [
        ({"model": "m"}, "replicas: required"),
        (
            {"model": "m", "replicas": {"static": ["http://a:1"]}, "disaggregation": {"protocol": "vllm"}},
            "replicas: not used by a disaggregated pool",
        ),
        (
            {
                "model": "m",
                "disaggregation": {
                    "protocol": "nixl",
                    "prefill": {"replicas": {}},
                    "decode": {"replicas": {}},
                },
            },
            "pools.0.disaggregation.protocol",
        ),
        (
            {
                "model": "m",
                "disaggregation": {
                    "protocol": "vllm",
                    "prefill": {"replicas": {}, "policy": "fastest"},
                    "decode": {"replicas": {}},
                },
            },
            "pools.0.disaggregation.prefill.policy",
        ),
        (
            {"model": "m", "disaggregation": {"protocol": "sglang", "prefill": {"replicas": {}}}},
            "pools.0.disaggregation.decode",
        ),
        (
            {
                "model": "m",
                "disaggregation": {
                    "protocol": "sglang",
                    "prefill": {"replicas": {}},
                    "decode": {"replicas": {}},
                    "sglang": {"bootstrap_port": 0},
                },
            },
            "pools.0.disaggregation.sglang.bootstrap_port",
        ),
    ],
)
def test_configuration_errors_name_the_key(pool: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        parse_settings({"pools": [pool]})


def test_the_decode_set_is_the_pool_and_the_prefill_set_its_own() -> None:
    settings = parse_settings(
        {
            "pools": [
                {
                    "model": "m",
                    "disaggregation": {
                        "protocol": "vllm",
                        "prefill": {"replicas": {"static": ["http://p:1"]}, "max_concurrency_per_replica": 2},
                        "decode": {"replicas": {"static": ["http://d:1"]}, "max_concurrency_per_replica": 9},
                    },
                }
            ]
        }
    )
    pool = settings.pools[0]
    assert (pool.replicas.static, pool.policy, pool.max_concurrency_per_replica) == (
        ["http://d:1"],
        "least-load",
        9,
    )
    assert pool.continues_streams, "a broken stream is continued: a new prefill, another decode replica"
    from gateway.upstream.prefill_set import prefill_set_settings

    prefill = prefill_set_settings(pool)
    assert (prefill.model, prefill.replicas.static, prefill.policy) == (
        "m/prefill",
        ["http://p:1"],
        "prefix-index",
    )
    assert (prefill.max_concurrency_per_replica, prefill.upstream_model) == (2, "m")


def test_a_request_waits_for_both_sets_caps() -> None:
    """Decode cap 1: the other requests wait in admission for the decode slot (a pair is admitted only
    with both slots), so neither set ever runs two of them at once; all are served."""
    protocol = Protocol.VLLM
    prefill, decode = _engine(Role.PREFILL, protocol), _engine(Role.DECODE, protocol)
    fleet = _fleet(protocol, prefill=[prefill], decode=[decode], decode_cap=1)
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            calls = [
                pool.submit(
                    fleet.client.completions.create, model=MODEL, prompt=f"{PROMPT} {n}", max_tokens=40
                )
                for n in range(3)
            ]
            texts = [call.result().choices[0].text for call in calls]
        assert all(len(text.split()) == 40 for text in texts)
        assert fleet.stats(decode)["max_active"] == 1
        assert fleet.stats(prefill)["max_active"] == 1, "a waiting request holds no prefill slot"
        assert wait_until(fleet.idle)
    finally:
        fleet.stop()


def test_the_documented_block_is_a_valid_pool() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "DISAGGREGATION.md").read_text()
    block = page.split("## Configuration", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    pool = parse_settings(yaml.safe_load(block)).pools[0]
    assert pool.disaggregation is not None and pool.disaggregation.prefill_policy == "prefix-index"
    assert (pool.policy, pool.max_concurrency_per_replica) == ("least-load", 64)
