"""The legs' bodies of a disaggregated pool, field by field (docs/MOCK_ENGINE.md, "Disaggregated serving
protocols"), and the route header that names both replicas."""

from __future__ import annotations

import orjson
import pytest

from gateway.base.errors import UpstreamProtocolError
from gateway.proxy.disagg.decision import PairDecision
from gateway.proxy.disagg.legs import kv_transfer_params, sglang_body, vllm_decode_body, vllm_prefill_body
from router.types import Decision

BASE = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 50,
    "max_completion_tokens": 50,
    "min_tokens": 5,
    "seed": 3,
}


def test_vllm_prefill_leg_asks_for_remote_decode_of_one_token_not_streamed() -> None:
    leg = orjson.loads(vllm_prefill_body(BASE))
    assert leg["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert (leg["stream"], leg["max_tokens"], leg["max_completion_tokens"]) == (False, 1, 1)
    assert "stream_options" not in leg and "min_tokens" not in leg
    assert (leg["messages"], leg["seed"], leg["model"]) == (BASE["messages"], 3, "m")
    without = orjson.loads(vllm_prefill_body({"prompt": "x", "max_tokens": 9}))
    assert "max_completion_tokens" not in without, "not added when the client did not send it"


def test_vllm_decode_leg_is_the_original_body_with_the_prefill_answers_params() -> None:
    answer = orjson.dumps(
        {"choices": [], "kv_transfer_params": {"do_remote_prefill": True, "remote_port": 1}}
    )
    params = kv_transfer_params(answer, "p:1")
    leg = orjson.loads(vllm_decode_body(BASE, params))
    assert leg == {**BASE, "kv_transfer_params": {"do_remote_prefill": True, "remote_port": 1}}


@pytest.mark.parametrize("answer", [b"not json", b"[]", b'{"choices": []}', b'{"kv_transfer_params": null}'])
def test_a_prefill_answer_without_params_is_the_prefill_replicas_protocol_error(answer: bytes) -> None:
    with pytest.raises(UpstreamProtocolError) as failed:
        kv_transfer_params(answer, "p:1")
    assert failed.value.replica_id == "p:1"


def test_sglang_legs_carry_the_three_bootstrap_fields() -> None:
    leg = orjson.loads(sglang_body(BASE, "10.0.0.7", 8998, 2**63 - 1))
    assert leg == {**BASE, "bootstrap_host": "10.0.0.7", "bootstrap_port": 8998, "bootstrap_room": 2**63 - 1}


def test_the_route_header_names_both_replicas() -> None:
    prefill = Decision("p:1", "prefix-index", "prefix_match", detail={"matched_prefix_blocks": 4})
    decode = Decision("d:2", "least-load", "least_load")
    pair = PairDecision.of(prefill, decode)
    assert pair.replica_id == "d:2"
    assert pair.header_value() == (
        "policy=least-load; branch=least_load; hops=0; prefill=p:1; prefill_policy=prefix-index; "
        "prefill_prefix_blocks=4; decode=d:2"
    )
