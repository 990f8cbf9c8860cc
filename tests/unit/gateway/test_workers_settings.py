"""`server.workers`: how many gateway processes, with either state backend; and the
metrics' single-process path (no multiprocess directory: `/metrics` renders the app's own registry)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import Gauge, values

from gateway.base.metric_naming import WORKERS_MAX, WORKERS_MIN, WORKERS_SUM
from gateway.base.metrics import MULTIPROC_DIR_ENV, GatewayMetrics, fix_worker_pid
from gateway.config.settings import ConfigError, load_settings, parse_settings

REDIS = {"backend": "redis"}


def test_one_worker_by_default() -> None:
    server = parse_settings({}).server
    assert server.workers == 1 and server.worker_count() == 1


@pytest.mark.parametrize("workers", [2, "auto"])
def test_several_workers_with_memory_state_are_accepted(workers: Any) -> None:
    """They share the supervisor's local state server (`gateway.ops.local_state`), not refused."""
    settings = parse_settings({"server": {"workers": workers}})
    assert settings.state.backend == "memory" and settings.server.workers == workers


def test_several_workers_with_redis_are_accepted() -> None:
    assert parse_settings({"server": {"workers": 3}, "state": REDIS}).server.worker_count() == 3


def test_auto_is_the_usable_cores() -> None:
    server = parse_settings({"server": {"workers": "auto"}, "state": REDIS}).server
    assert server.workers == "auto"
    assert server.worker_count() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("workers", [0, -1, "many", 1.5])
def test_bad_worker_counts_are_refused_by_name(workers: Any) -> None:
    with pytest.raises(ConfigError, match=r"server\.workers"):
        parse_settings({"server": {"workers": workers}, "state": REDIS})


def test_workers_from_the_environment() -> None:
    env = {"LLM_GATEWAY__SERVER__WORKERS": "auto", "LLM_GATEWAY__STATE__BACKEND": "redis"}
    assert load_settings(environ=env).server.workers == "auto"
    env["LLM_GATEWAY__SERVER__WORKERS"] = "2"
    assert load_settings(environ=env).server.worker_count() == 2


def test_one_process_renders_its_own_registry() -> None:
    assert MULTIPROC_DIR_ENV not in os.environ
    metrics = GatewayMetrics()
    assert metrics.scrape_registry is metrics.registry
    metrics.requests_total.labels("m", "success").inc()
    other = GatewayMetrics()
    assert (
        other.registry.get_sample_value("llm_gateway_requests_total", {"model": "m", "outcome": "success"})
        is None
    )


WORKER = """
import sys
from gateway.base.metric_naming import WORKERS_MAX, WORKERS_MIN, WORKERS_SUM
from gateway.base.metrics import GatewayMetrics
metrics = GatewayMetrics()
served, inflight, breaker, up = (float(v) for v in sys.argv[1:5])
metrics.requests_total.labels("m", "success").inc(served)
metrics.inflight.labels("r").set(inflight)
metrics.breaker_state.labels("r").set(breaker)
metrics.replica_up.labels("r").set(up)
if sys.argv[5] == "render":
    sys.stdout.write(metrics.render().decode())
"""


def test_several_workers_render_every_value_merged(tmp_path: Path) -> None:
    """In the client's multiprocess mode (set before import, as the supervisor does), `render` merges the
    directory: counters summed, in-flight summed, the breaker's worst state, up only if up in every
    worker. (A process that has exited counts like a live one here: the supervisor drops a worker's live
    gauges when it exits.)"""
    env = {**os.environ, MULTIPROC_DIR_ENV: str(tmp_path)}

    def worker(*args: str) -> str:
        command = [sys.executable, "-c", WORKER, *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout

    worker("2", "4", "2", "1", "-")
    lines = worker("3", "1", "0", "0", "render").splitlines()
    assert 'llm_gateway_requests_total{model="m",outcome="success"} 5.0' in lines
    assert 'llm_gateway_inflight{replica="r"} 5.0' in lines
    assert 'llm_gateway_breaker_state{replica="r"} 2.0' in lines
    assert 'llm_gateway_replica_up{replica="r"} 0.0' in lines
    assert not [line for line in lines if "pid=" in line], "no gauge left to the per-pid default"


def test_every_gauge_declares_how_workers_merge() -> None:
    """The table of `gateway.base.metric_naming`: no gauge is left to the client's default ("all": one
    series per worker pid)."""
    registry = GatewayMetrics().registry
    gauges = [c for c in registry._collector_to_names if isinstance(c, Gauge)]
    assert len(gauges) > 10
    undeclared = [
        g._name for g in gauges if g._multiprocess_mode not in (WORKERS_SUM, WORKERS_MAX, WORKERS_MIN)
    ]
    assert not undeclared


FIXED_PID_WORKER = """
import os, sys
from gateway.base.metrics import GatewayMetrics, fix_worker_pid
fix_worker_pid()
metrics = GatewayMetrics()
def no_getpid():
    raise AssertionError("getpid on a metric write")
os.getpid = no_getpid
metrics.requests_total.labels("m", "success").inc(float(sys.argv[1]))
metrics.inflight.labels("r").set(2)
if sys.argv[2] == "render":
    sys.stdout.write(metrics.render().decode())
"""


def test_a_worker_with_its_pid_fixed_writes_without_asking_the_os(tmp_path: Path) -> None:
    """`fix_worker_pid` (a spawned worker's entry point calls it): no `os.getpid()` per metric write, and
    the values still land in this pid's files and merge with the other workers'."""
    env = {**os.environ, MULTIPROC_DIR_ENV: str(tmp_path)}

    def worker(*args: str) -> str:
        command = [sys.executable, "-c", FIXED_PID_WORKER, *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout

    worker("2", "-")
    lines = worker("3", "render").splitlines()
    assert 'llm_gateway_requests_total{model="m",outcome="success"} 5.0' in lines
    assert 'llm_gateway_inflight{replica="r"} 4.0' in lines
    assert len(list(tmp_path.glob("counter_*.db"))) == 2  # one file per worker pid


def test_fix_worker_pid_without_multiprocess_mode_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_DIR_ENV, raising=False)
    before = values.ValueClass
    fix_worker_pid()
    assert values.ValueClass is before
