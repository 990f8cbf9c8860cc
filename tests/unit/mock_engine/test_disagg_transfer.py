"""Disaggregated decode in the engine cores: the KV link formula, the transfer wait, KV held meanwhile."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.physics import PhysicsCore, ProfileError, load_profile, parse_profile
from mock_engine.physics.kv_link import KV_LINK_PRESETS, KvLink, parse_kv_link
from tests.unit.mock_engine.harness import request, run_until_idle, tiny

# tiny: weights read 1 ms per step, KV read 2.048e-7 s per context token, prefill 1e-5 s per token.
WEIGHTS_S = 0.001
KV_S_PER_TOKEN = 1024 / (10e9 * 0.5)
PREFILL_S_PER_TOKEN = 1 / 100_000


def test_transfer_time_is_prompt_tokens_times_kv_bytes_over_bandwidth() -> None:
    h100 = load_profile("h100-13b-fp16")
    # 8,192 tokens x 163,840 B = 1.342 GB; at 50 GB/s (rdma) 26.8 ms, 10 GB/s (tcp) 134 ms, 450 GB/s 2.98 ms
    assert KV_LINK_PRESETS["rdma"].transfer_s(8192, h100.kv_bytes_per_token) == pytest.approx(0.0268435456)
    assert KV_LINK_PRESETS["tcp"].transfer_s(8192, h100.kv_bytes_per_token) == pytest.approx(0.134217728)
    assert KV_LINK_PRESETS["nvlink"].transfer_s(8192, h100.kv_bytes_per_token) == pytest.approx(
        1.34217728 / 450
    )
    assert KvLink("x", 1e9, latency_s=0.002).transfer_s(1000, 1000) == pytest.approx(0.003)
    assert KvLink("x", 1e9, latency_s=0.002).transfer_s(0, 1000) == pytest.approx(0.002)


def test_kv_link_parsing_presets_numbers_and_errors() -> None:
    assert parse_kv_link("tcp") is KV_LINK_PRESETS["tcp"]
    assert parse_kv_link("25").bandwidth_bytes_per_s == 25e9
    for bad in ("fast", "0", "-3"):
        with pytest.raises(ProfileError):
            parse_kv_link(bad)


def test_profile_kv_link_section() -> None:
    document = {
        "name": "p",
        "model": {"n_layers": 1, "n_kv_heads": 1, "d_head": 8, "bytes_per_element": 2, "weight_bytes": 1000},
        "gpu": {"hbm_bytes": 10_000_000, "overhead_bytes": 0, "memory_bandwidth_bytes_per_s": 1e9},
        "prefill": {"tokens_per_s": 1000},
        "decode": {"kv_read_efficiency_ratio": 0.5},
        "scheduler": {"max_num_seqs": 4, "block_size_tokens": 16},
    }
    assert parse_profile(document).kv_link is None
    assert parse_profile(document | {"kv_link": {"preset": "nvlink"}}).kv_link is KV_LINK_PRESETS["nvlink"]
    custom = parse_profile(document | {"kv_link": {"bandwidth_bytes_per_s": 2e9, "latency_s": 0.001}}).kv_link
    assert custom == KvLink("custom", 2e9, 0.001)
    with pytest.raises(ProfileError, match=r"kv_link\.preset"):
        parse_profile(document | {"kv_link": {"preset": "carrier-pigeon"}})
    with pytest.raises(ProfileError, match=r"kv_link\.speed"):
        parse_profile(document | {"kv_link": {"speed": 3}})


def test_physics_decode_waits_the_transfer_and_skips_the_prefill() -> None:
    """First token = admission + transfer + one step computing 1 token (not 200: the KV arrived)."""
    core = PhysicsCore(tiny())
    transfer_s = 0.05
    core.submit(
        replace(request("d", prompt_tokens=200, max_tokens=2, arrival_s=1.0), kv_transfer_s=transfer_s)
    )
    assert core.next_event_s() == pytest.approx(1.0 + transfer_s)  # an idle step until the KV lands
    assert core.advance(1.0 + transfer_s / 2) == []
    stats = core.stats()
    assert stats.running == 1
    assert stats.kv_usage_ratio == pytest.approx(13 / 250)  # ceil(200 / 16) blocks held during the transfer
    events = run_until_idle(core)
    first_s = 1.0 + transfer_s + WEIGHTS_S + 1 * PREFILL_S_PER_TOKEN
    second_s = first_s + WEIGHTS_S + 201 * KV_S_PER_TOKEN
    assert [e.time_s for e in events] == pytest.approx([first_s, second_s])
    assert core.stats().kv_usage_ratio == 0.0


def test_physics_transfer_does_not_block_other_sequences() -> None:
    """A sequence waiting for its KV leaves the engine free: an aggregated request decodes meanwhile."""
    core = PhysicsCore(tiny())
    core.submit(replace(request("d", prompt_tokens=64, max_tokens=1), kv_transfer_s=1.0))
    core.submit(request("a", prompt_tokens=64, max_tokens=3))
    events = run_until_idle(core)
    a_times = [e.time_s for e in events if e.request_id == "a"]
    (d_time,) = [e.time_s for e in events if e.request_id == "d"]
    assert a_times[-1] < 0.01
    assert d_time == pytest.approx(1.0 + WEIGHTS_S + PREFILL_S_PER_TOKEN)


def test_fixed_core_decode_first_token_after_transfer_and_one_token_step() -> None:
    core = FixedDelayCore(first_token_delay_s=0.5, token_delay_s=0.01)
    core.submit(replace(request("d", prompt_tokens=10, max_tokens=2, arrival_s=2.0), kv_transfer_s=0.2))
    core.submit(request("a", prompt_tokens=10, max_tokens=1, arrival_s=2.0))
    events = {(e.request_id, e.index): e.time_s for e in core.advance(10.0)}
    assert events[("d", 0)] == pytest.approx(2.21)
    assert events[("d", 1)] == pytest.approx(2.22)
    assert events[("a", 0)] == pytest.approx(2.5)
