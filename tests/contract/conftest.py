"""The contract suite (DESIGN §4): the documented HTTP, error, header and metric contracts, checked
black-box against real gateways in front of mock engines on 127.0.0.1.

The gateways are started once for the package and shared: each situation of the error table has its own
pool (its own engines, breaker and health state), so tests do not disturb each other and counters are
read as differences around the request under test. Only the draining test, which ends its gateway,
starts its own.
"""

from __future__ import annotations

import hashlib
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mock_engine.faults import FaultSettings
from tests.servers import ServerThread, free_port, gateway_settings, start_gateway, start_mock_engine

MODEL = "test-model"
CHAT = "/v1/chat/completions"
CLIENT_TIMEOUT = httpx.Timeout(10.0)

# Pools of the shared gateway, one per situation (see `contract_gateway`).
DEAD = "dead-model"
FAILOVER = "failover-model"
UPSTREAM_503 = {False: "upstream-503-model", True: "upstream-503-stream-model"}  # by `stream`
UPSTREAM_500 = "upstream-500-model"
SILENT = "silent-model"
SLOW = "slow-model"
STALL = "stall-model"
CRASH = "crash-model"
LONG = "long-model"

UPSTREAM_RETRY_AFTER_S = 7
SILENT_TTFT_S = 0.2
SLOW_FIRST_TOKEN_MS = 1000
SLOW_NONSTREAM_S = 0.3
STALL_IDLE_S = 0.2
LONG_TOTAL_S = 0.4

# The tenant gateway: keys and their limits.
LIMITED_KEYS = {"key-three": 3, "key-two": 2}  # requests per minute: one refills in 20 s / 30 s
FREE_KEY = "key-free"


def chat(model: str = MODEL, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **extra}


def assert_error(response: httpx.Response, status: int, reason: str, *, retry_after: bool) -> dict[str, Any]:
    """The error contract: status, reason header, OpenAI-style JSON body with the reason as its code,
    and `Retry-After` present (an integer ≥ 1) exactly when the table says so."""
    assert response.status_code == status, response.text
    assert response.headers["x-gateway-reject-reason"] == reason
    assert response.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["code"] == reason and error["message"] and error["type"]
    if retry_after:
        retry_after_s(response)
    else:
        assert "retry-after" not in response.headers, response.headers["retry-after"]
    return error


def retry_after_s(response: httpx.Response) -> int:
    """`Retry-After` as the contract has it: an integer number of seconds ≥ 1."""
    value = response.headers["retry-after"]
    assert re.fullmatch(r"[0-9]+", value), f"Retry-After {value!r} is not an integer number of seconds"
    assert int(value) >= 1
    return int(value)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def metric_samples(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """`/metrics` parsed: sample name → [(labels, value)]."""
    response = httpx.get(url + "/metrics", timeout=CLIENT_TIMEOUT)
    assert response.status_code == 200
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def metric_value(url: str, name: str, **labels: str) -> float:
    """One sample's value (0.0 when the series does not exist yet: counters start there)."""
    for sample_labels, value in metric_samples(url).get(name, []):
        if all(sample_labels.get(k) == v for k, v in labels.items()):
            return value
    return 0.0


def engine_stats(engine: ServerThread) -> dict[str, int]:
    stats: dict[str, int] = httpx.get(engine.url + "/mock/stats", timeout=CLIENT_TIMEOUT).json()
    return stats


def replica_id(server_url: str) -> str:
    return server_url.removeprefix("http://")


class SilentReplica:
    """A listening socket that never accepts: connections complete (the kernel's backlog), requests are
    sent, and no byte ever comes back — a replica that does not answer at all."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def stop(self) -> None:
        self._sock.close()


@dataclass
class Started:
    """Everything the package started; stopped together (in parallel) at the end."""

    servers: list[ServerThread | SilentReplica] = field(default_factory=list)

    def engine(self, **kwargs: Any) -> ServerThread:
        server = start_mock_engine(model=MODEL, **kwargs)
        self.servers.append(server)
        return server

    def gateway(self, raw: dict[str, Any]) -> ServerThread:
        server = start_gateway(raw)
        self.servers.append(server)
        return server

    def silent(self) -> SilentReplica:
        server = SilentReplica()
        self.servers.append(server)
        return server

    def stop(self) -> None:
        threads = [threading.Thread(target=server.stop) for server in self.servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)


@pytest.fixture(scope="package")
def started() -> Iterator[Started]:
    everything = Started()
    yield everything
    everything.stop()


@dataclass
class ContractGateway:
    gateway: ServerThread
    engines: dict[str, list[ServerThread]]
    dead_urls: list[str]

    @property
    def url(self) -> str:
        return self.gateway.url


def _pool(model: str, urls: list[str], **overrides: Any) -> dict[str, Any]:
    return {
        "model": model,
        "engine": "vllm",
        "replicas": {"static": urls},
        "policy": "least-load",
        **overrides,
    }


@pytest.fixture(scope="package")
def contract_gateway(started: Started) -> ContractGateway:
    """One gateway, one pool per situation:

    - `test-model`: two healthy engines (success paths, request validation, headers, metrics);
    - `dead-model`: two closed ports (connect failure, then no replica while they are held out);
    - `failover-model`: a closed port and a live engine (a connect failure fails over invisibly);
    - `upstream-503[-stream]-model` / `upstream-500-model`: engines answering 503 + Retry-After 7 / 500;
    - `silent-model`: two replicas that never answer (first-token deadline before any header, retried);
    - `slow-model`: an engine whose first token is late (TTFT deadline, non-streamed total bound);
    - `stall-model` / `crash-model` / `long-model`: streams that stall, are reset, or outlive `total_s`.
    """
    unavailable = FaultSettings(error_rate=1.0, error_status=503, retry_after_s=UPSTREAM_RETRY_AFTER_S)
    engines = {
        MODEL: [started.engine() for _ in range(2)],
        FAILOVER: [started.engine()],
        **{model: [started.engine(faults=unavailable)] for model in UPSTREAM_503.values()},
        UPSTREAM_500: [started.engine(faults=FaultSettings(error_rate=1.0, error_status=500))],
        SLOW: [started.engine(faults=FaultSettings(slow_first_token_ms=SLOW_FIRST_TOKEN_MS))],
        STALL: [started.engine(faults=FaultSettings(stall_after_tokens=2))],
        CRASH: [started.engine(faults=FaultSettings(crash_after_tokens=2))],
        LONG: [started.engine(token_delay_ms=20, default_max_tokens=200)],
    }
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    silent = [started.silent() for _ in range(2)]
    lenient_breaker = {"consecutive_failures": 100}
    pools = [
        _pool(MODEL, [e.url for e in engines[MODEL]]),
        _pool(DEAD, dead, health={"enabled": False}),  # only the requests find out: no probe races them
        _pool(FAILOVER, [f"http://127.0.0.1:{free_port()}", engines[FAILOVER][0].url], policy="round-robin"),
        *(_pool(model, [engines[model][0].url], breaker=lenient_breaker) for model in UPSTREAM_503.values()),
        _pool(UPSTREAM_500, [engines[UPSTREAM_500][0].url], breaker=lenient_breaker),
        _pool(
            SILENT,
            [replica.url for replica in silent],
            timeouts={"ttft_s": SILENT_TTFT_S},
            retries={"max_attempts": 2, "backoff_initial_s": 0.01, "backoff_max_s": 0.02},
            health={"enabled": False},
            scrape={"enabled": False},
            breaker=lenient_breaker,
        ),
        _pool(
            SLOW,
            [engines[SLOW][0].url],
            timeouts={"ttft_s": 5, "nonstream_s": SLOW_NONSTREAM_S},
            retries={"max_attempts": 1},
            breaker=lenient_breaker,
        ),
        _pool(STALL, [engines[STALL][0].url], timeouts={"idle_s": STALL_IDLE_S}, breaker=lenient_breaker),
        _pool(CRASH, [engines[CRASH][0].url], retries={"max_attempts": 1}, breaker=lenient_breaker),
        _pool(LONG, [engines[LONG][0].url], timeouts={"total_s": LONG_TOTAL_S}),
    ]
    gateway = started.gateway(gateway_settings(pools))
    return ContractGateway(gateway, engines, dead)


@pytest.fixture(scope="package")
def tenant_gateway(started: Started) -> ServerThread:
    """Tenants configured: every request needs a known key; two keys are rate limited."""
    engine = started.engine()
    tenants: list[dict[str, Any]] = [
        {"name": f"limited-{per_min}", "api_key_hashes": [key_hash(key)], "requests_per_min": per_min}
        for key, per_min in LIMITED_KEYS.items()
    ]
    tenants.append({"name": "free", "api_key_hashes": [key_hash(FREE_KEY)]})
    return started.gateway(gateway_settings([_pool(MODEL, [engine.url])], tenants=tenants))


@pytest.fixture(scope="package")
def queue_gateway(started: Started) -> ServerThread:
    """One replica with a cap of 1, a queue of depth 1, and a short interactive max wait."""
    engine = started.engine(token_delay_ms=20)
    raw = gateway_settings([_pool(MODEL, [engine.url], max_concurrency_per_replica=1)])
    raw["admission"] = {
        "classes": {
            "critical": {"max_wait_s": 5},
            "interactive": {"max_wait_s": 0.3},
            "batch": {"max_wait_s": 5},
        },
        "max_queue_depth": 1,
        "early_refusal_ratio": None,
    }
    return started.gateway(raw)


@pytest.fixture(scope="package")
def state_down_gateway(started: Started) -> ServerThread:
    """Shared state on Redis that is down (a closed port) with `on_error: fail_closed`."""
    engine = started.engine()
    state = {"backend": "redis", "url": f"redis://127.0.0.1:{free_port()}/0", "on_error": "fail_closed"}
    tenants = [
        {"name": "limited", "api_key_hashes": [key_hash("key-three")], "requests_per_min": 3},
        {"name": "free", "api_key_hashes": [key_hash(FREE_KEY)]},
    ]
    return started.gateway(gateway_settings([_pool(MODEL, [engine.url])], state=state, tenants=tenants))
