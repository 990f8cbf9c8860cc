"""`server.workers: 2` for real: `python -m cli serve` supervises two worker processes on one address,
sharing Redis state, in front of two mock engines (the harness: tests/supervised.py). Linux only (/proc)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervised import (
    Supervised,
    check_both_serve_and_either_shows_the_merged_metrics,
    check_sigterm_drains_both_workers,
    start,
    stop,
)

from .conftest import REDIS_URL

pytestmark = [
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc (Linux)"),
]

MODEL = "workers-model"


@pytest.fixture
def started(tmp_path: Path, mock_engines, redis_reachable: str | None) -> Iterator[Supervised | None]:
    if redis_reachable is not None:  # the autouse fixture skips (or fails) the test
        yield None
        return
    engines = [mock_engines(model=MODEL, first_token_delay_ms=5, token_delay_ms=20) for _ in range(2)]
    state = {
        "backend": "redis",
        "url": REDIS_URL,
        "key_prefix": f"llm-gateway-test:{uuid.uuid4().hex}:",
        "timeout_s": 2.0,
    }
    supervised = start(tmp_path, engines, MODEL, state)
    yield supervised
    stop(supervised)


def test_both_workers_serve_and_either_shows_the_merged_metrics(started: Supervised) -> None:
    assert started.state_servers() == [], "no local state server with Redis state"
    check_both_serve_and_either_shows_the_merged_metrics(started, MODEL)


def test_sigterm_drains_both_workers_and_the_supervisor_exits_0(started: Supervised) -> None:
    check_sigterm_drains_both_workers(started, MODEL)
