"""The mock engine CLI's disaggregation flags: role, protocol, link, and their defaults."""

from __future__ import annotations

import argparse

import pytest

from mock_engine import cli
from mock_engine.disagg_params import Protocol, Role
from mock_engine.physics.kv_link import KV_LINK_PRESETS


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_default_is_an_aggregated_replica() -> None:
    app = cli.build_app(_args())
    assert app.config.disagg.role is Role.BOTH
    assert app.disagg is None


def test_role_protocol_and_link_flags() -> None:
    app = cli.build_app(
        _args("--role", "decode", "--disagg-protocol", "sglang", "--kv-link", "tcp", "--profile", "tiny")
    )
    disagg = app.config.disagg
    assert (disagg.role, disagg.protocol, disagg.link) == (
        Role.DECODE,
        Protocol.SGLANG,
        KV_LINK_PRESETS["tcp"],
    )
    assert (disagg.kv_bytes_per_token, disagg.block_size_tokens) == (1024, 16)  # tiny: 2 x 4 x 1 x 64 x 2
    assert app.disagg is not None
    prefill = cli.build_app(
        _args("--role", "prefill", "--engine-id", "e7", "--kv-link", "12.5")
    ).config.disagg
    assert (prefill.engine_id, prefill.link.bandwidth_bytes_per_s) == ("e7", 12.5e9)
    assert prefill.link is not KV_LINK_PRESETS["rdma"]
    assert cli.build_app(_args("--role", "prefill")).config.disagg.link is KV_LINK_PRESETS["rdma"]


def test_bad_link_or_role_stops_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(_args("--role", "decode", "--kv-link", "pigeon")) == 2
    assert "kv_link" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _args("--role", "middle")
