"""Fault flags of `mock-engine` set the initial settings; bad values are refused before serving."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import httpx
import pytest

from mock_engine import cli
from mock_engine.faults import FaultSettings, FaultSettingsError
from tests.servers import free_port


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_no_flags_no_faults() -> None:
    assert cli.fault_settings(_parse()) == FaultSettings()


def test_every_fault_flag_maps_to_its_setting() -> None:
    args = _parse(
        "--error-rate", "0.1", "--error-status", "503", "--retry-after-s", "2",
        "--slow-first-token-ms", "300", "--slow-first-token-rate", "0.5",
        "--stall-after-tokens", "4", "--stall-rate", "0.2",
        "--crash-after-tokens", "6", "--crash-rate", "0.3",
        "--jitter-ms", "15", "--refuse-connections", "--refuse-for-s", "5",
        "--poison-marker", "BAD PROMPT", "--poison-effect", "crash",
    )  # fmt: skip
    assert cli.fault_settings(args) == FaultSettings(
        error_rate=0.1,
        error_status=503,
        retry_after_s=2.0,
        slow_first_token_ms=300.0,
        slow_first_token_rate=0.5,
        stall_after_tokens=4,
        stall_rate=0.2,
        crash_after_tokens=6,
        crash_rate=0.3,
        jitter_ms=15.0,
        refuse_connections=True,
        refuse_for_s=5.0,
        poison_marker="BAD PROMPT",
        poison_effect="crash",
    )


def test_invalid_flag_values_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(FaultSettingsError, match="error_rate"):
        cli.fault_settings(_parse("--error-rate", "3"))
    assert cli.run(_parse("--error-status", "200")) == 2
    assert "error_status" in capsys.readouterr().err
    assert cli.run(_parse("--poison-effect", "hang")) == 2
    assert "poison_effect" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_the_command_serves_with_its_fault_flags() -> None:
    port = free_port()
    argv = [
        "--port",
        str(port),
        "--seed",
        "3",
        "--error-rate",
        "1",
        "--error-status",
        "429",
        "--retry-after-s",
        "2",
    ]
    proc = subprocess.Popen([sys.executable, "-m", "mock_engine", *argv])
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                faults = httpx.get(url + "/mock/faults", timeout=1.0).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "mock engine did not start"
                time.sleep(0.05)
        assert faults["error_rate"] == 1.0 and faults["error_status"] == 429
        response = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x"}, timeout=5.0)
        assert response.status_code == 429 and response.headers["retry-after"] == "2"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
