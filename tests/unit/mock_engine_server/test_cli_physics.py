"""The mock engine CLI with the physics core: profile selection, context limit, flavour, calibration."""

from __future__ import annotations

import argparse

import httpx
import pytest

from mock_engine import cli
from mock_engine.physics import PhysicsCore
from tests.servers import ServerThread


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_physics_core_serves_with_its_context_limit_and_flavour() -> None:
    app = cli.build_app(
        _args("--core", "physics", "--profile", "tiny", "--speed", "50", "--metrics-flavour", "tgi")
    )
    assert isinstance(app.driver.core, PhysicsCore)
    server = ServerThread(app, "physics-mock").start()
    try:
        ok = httpx.post(
            server.url + "/v1/completions", json={"model": "mock-model", "prompt": "hi", "max_tokens": 4}
        )
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
        limit = app.config.max_context_tokens
        assert limit == app.driver.core.kv_capacity_tokens
        too_big = httpx.post(
            server.url + "/v1/completions", json={"model": "mock-model", "prompt": "hi", "max_tokens": limit}
        )
        assert too_big.status_code == 400 and "exceeds" in too_big.json()["error"]["message"]
        assert "tgi_queue_size" in httpx.get(server.url + "/metrics").text
    finally:
        server.stop()


def test_calibrate_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(_args("--calibrate", "tiny")) == 0
    out = capsys.readouterr().out
    assert "| batch |" in out and "tiny" in out


def test_unknown_profile_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(_args("--core", "physics", "--profile", "nope")) == 2
    assert "nope" in capsys.readouterr().err
