"""The disaggregated legs' wire fields as the mock checks them, and the prefill's transfer table."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mock_engine.disagg_params import MAX_ROOM, sglang_leg, vllm_decode_leg, vllm_prefill_leg
from mock_engine.transfers import TransferTable
from mock_engine.validation import RequestError

DECODE_PARAMS: dict[str, Any] = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "e1",
    "remote_request_id": "r1",
    "remote_block_ids": [0, 1],
    "remote_host": "10.0.0.1",
    "remote_port": 5600,
    "tp_size": 1,
}


def test_vllm_prefill_leg_needs_remote_decode_no_stream_and_max_tokens() -> None:
    ok = {"kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}, "max_tokens": 1}
    vllm_prefill_leg(ok)
    for bad, param in (
        ({}, "kv_transfer_params"),
        ({"kv_transfer_params": {"do_remote_decode": False}, "max_tokens": 1}, "kv_transfer_params"),
        ({"kv_transfer_params": {"do_remote_decode": "yes"}, "max_tokens": 1}, "kv_transfer_params"),
        (ok | {"stream": True}, "stream"),
        ({"kv_transfer_params": {"do_remote_decode": True}}, "max_tokens"),
    ):
        with pytest.raises(RequestError) as caught:
            vllm_prefill_leg(bad)
        assert caught.value.param == param


def test_vllm_decode_leg_reads_the_prefill_answers_params() -> None:
    pull = vllm_decode_leg({"kv_transfer_params": DECODE_PARAMS})
    assert (pull.remote_engine_id, pull.remote_request_id, pull.remote_block_ids) == ("e1", "r1", (0, 1))
    assert (pull.remote_host, pull.remote_port) == ("10.0.0.1", 5600)
    for change in (
        {"do_remote_prefill": False},
        {"do_remote_decode": True},
        {"remote_engine_id": None},
        {"remote_request_id": ""},
        {"remote_block_ids": [1, "2"]},
        {"remote_block_ids": None},
        {"remote_host": 3},
        {"remote_port": 0},
        {"remote_port": True},
    ):
        with pytest.raises(RequestError) as caught:
            vllm_decode_leg({"kv_transfer_params": DECODE_PARAMS | change})
        assert caught.value.param == "kv_transfer_params", change


def test_sglang_leg_needs_all_three_bootstrap_fields() -> None:
    fields = {"bootstrap_host": "10.0.0.2", "bootstrap_port": 8998, "bootstrap_room": MAX_ROOM}
    leg = sglang_leg(fields)
    assert (leg.host, leg.port, leg.room) == ("10.0.0.2", 8998, MAX_ROOM)
    for name, value in (
        ("bootstrap_host", None),
        ("bootstrap_port", None),
        ("bootstrap_port", 70000),
        ("bootstrap_room", -1),
        ("bootstrap_room", MAX_ROOM + 1),
        ("bootstrap_room", "7"),
        ("bootstrap_room", [1, 2]),
    ):
        with pytest.raises(RequestError) as caught:
            sglang_leg(fields | {name: value})
        assert caught.value.param == name


def test_transfer_table_claims_once_checks_shape_and_expires() -> None:
    now = [0.0]
    table = TransferTable(hold_s=10.0, clock=lambda: now[0])

    async def scenario() -> None:
        table.register("k", prompt_tokens=40, block_ids=(3, 4, 5))
        assert (await table.claim("k", 0.0, 40)).status == "pending"
        waiter = asyncio.create_task(table.claim("k", 5.0, 40, (3, 4, 5)))
        await asyncio.sleep(0)
        table.finish("k", ok=True)
        result = await waiter
        assert (result.status, result.prompt_tokens) == ("done", 40)
        assert (await table.claim("k", 0.0, 40)).status == "unknown"  # one decode per transfer
        table.register("m", prompt_tokens=40, block_ids=(1,))
        table.finish("m", ok=True)
        assert (await table.claim("m", 0.0, 41)).status == "mismatch"
        assert (await table.claim("m", 0.0, 40, (2,))).status == "mismatch"
        table.register("f", prompt_tokens=1)
        table.finish("f", ok=False)
        assert (await table.claim("f", 0.0, 1)).status == "failed"
        now[0] = 11.0
        assert (await table.claim("m", 0.0, 40, (1,))).status == "unknown"
        assert len(table) == 0

    asyncio.run(scenario())
