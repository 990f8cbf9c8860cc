"""LoRA adapters in the cores: vLLM's max_loras rule (a request for another adapter waits while the batch
holds max_loras others; requests behind it may pass) and the per-adapter prefix cache."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mock_engine.core import EngineRequest, TokenEvent, distinct_adapters, lora_blocked
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.physics import PhysicsCore, prefix_block_hashes

from .harness import assert_complete, first_token_s, request, run_until_idle, tiny


def on(adapter: str | None, base: EngineRequest) -> EngineRequest:
    return replace(base, adapter=adapter)


# --- the rule ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "running", "max_loras", "blocked"),
    [
        (None, {"a", "b"}, 1, False),  # the base model never waits for an adapter slot
        ("a", set(), 1, False),
        ("a", {"a"}, 1, False),  # an adapter already in the batch joins it
        ("b", {"a"}, 1, True),
        ("b", {"a"}, 2, False),
        ("c", {"a", "b"}, 2, True),
    ],
)
def test_lora_blocked_is_vllms_max_loras_rule(
    adapter: str | None, running: set[str], max_loras: int, blocked: bool
) -> None:
    assert lora_blocked(adapter, running, max_loras) is blocked


def test_distinct_adapters_keeps_first_seen_order_and_drops_the_base_model() -> None:
    assert distinct_adapters(["b", None, "a", "b", None]) == ("b", "a")


# --- physics core --------------------------------------------------------------------------------------


def test_physics_a_second_adapter_waits_until_the_first_adapters_requests_all_finish() -> None:
    core = PhysicsCore(tiny(), max_loras=1)
    core.submit(on("a", request("a1", 32, 4)))
    core.submit(on("a", request("a2", 32, 6)))
    core.submit(on("b", request("b1", 32, 3)))
    core.advance(0.0)
    core.next_event_s()  # plans the first step
    stats = core.stats()
    assert (stats.running, stats.waiting) == (2, 1)
    assert stats.running_adapters == ("a",) and stats.waiting_adapters == ("b",)
    events = run_until_idle(core)
    assert_complete(events, {"a1": 4, "a2": 6, "b1": 3})
    last_a_s = max(e.time_s for e in events if e.request_id.startswith("a"))
    assert first_token_s(events, "b1") > last_a_s
    assert core.stats().waiting == 0 and core.stats().running_adapters == ()


def test_physics_base_model_and_same_adapter_requests_pass_a_waiting_adapter_request() -> None:
    core = PhysicsCore(tiny(), max_loras=1)
    core.submit(on("a", request("a1", 32, 20)))
    core.submit(on("b", request("b1", 32, 2)))  # waits for "a"
    core.submit(request("base", 32, 2))  # behind b1 in the queue, admitted anyway
    core.submit(on("a", request("a2", 32, 2)))  # joins the running adapter
    events = run_until_idle(core)
    a1_end_s = max(e.time_s for e in events if e.request_id == "a1")
    assert first_token_s(events, "base") < a1_end_s
    assert first_token_s(events, "a2") < a1_end_s
    assert first_token_s(events, "b1") > a1_end_s


def test_physics_max_loras_two_runs_two_adapters_together() -> None:
    core = PhysicsCore(tiny(), max_loras=2)
    for name in ("a", "b", "c"):
        core.submit(on(name, request(name, 32, 5)))
    core.next_event_s()
    stats = core.stats()
    assert stats.running_adapters == ("a", "b") and stats.waiting_adapters == ("c",)
    events = run_until_idle(core)
    assert first_token_s(events, "c") > first_token_s(events, "a")


def test_physics_an_aborted_blocker_lets_the_waiting_adapter_in() -> None:
    core = PhysicsCore(tiny(), max_loras=1)
    core.submit(on("a", request("a1", 32, 1000)))
    core.submit(on("b", request("b1", 32, 2)))
    core.advance(core.next_event_s() or 0.0)
    assert core.stats().waiting_adapters == ("b",)
    core.abort("a1")
    events = run_until_idle(core)
    assert [e.request_id for e in events] == ["b1", "b1"]


def test_physics_prefix_cache_is_per_adapter() -> None:
    """A prompt cached under the base model is a miss for an adapter, then a hit for that adapter."""
    text = "x" * 64 * 5  # 5 full blocks of 16 tokens
    core = PhysicsCore(tiny(), max_loras=1)

    def hits_of(req: EngineRequest) -> int:
        before = core.stats().prefix_cache_hits_tokens
        core.submit(req)
        run_until_idle(core)
        return core.stats().prefix_cache_hits_tokens - before

    assert hits_of(request("base1", 81, 1, arrival_s=0.0, text=text + "?")) == 0
    assert hits_of(request("base2", 81, 1, arrival_s=1.0, text=text + "!")) == 5 * 16
    assert hits_of(on("a", request("a1", 81, 1, arrival_s=2.0, text=text + "?"))) == 0
    assert hits_of(on("a", request("a2", 81, 1, arrival_s=3.0, text=text + "!"))) == 5 * 16
    assert hits_of(on("b", request("b1", 81, 1, arrival_s=4.0, text=text + "?"))) == 0


def test_prefix_block_hashes_are_salted_by_the_adapter_and_unchanged_for_the_base_model() -> None:
    text = "y" * 64 * 3
    base = prefix_block_hashes(text, 16)
    assert prefix_block_hashes(text, 16, adapter=None) == base
    a, b = prefix_block_hashes(text, 16, adapter="a"), prefix_block_hashes(text, 16, adapter="b")
    assert len(a) == len(base) == 3
    assert not set(a) & set(base) and not set(a) & set(b)
    assert prefix_block_hashes(text, 16, adapter="a") == a


# --- fixed-delay core ----------------------------------------------------------------------------------


def _run(core: FixedDelayCore, until_s: float) -> list[TokenEvent]:
    return core.advance(until_s)


def test_fixed_core_a_second_adapter_starts_when_the_first_adapters_last_request_finishes() -> None:
    core = FixedDelayCore(first_token_delay_s=0.1, token_delay_s=0.01, max_loras=1)
    core.submit(on("a", request("a1", 8, 3, arrival_s=0.0)))  # tokens at 0.10, 0.11, 0.12
    core.submit(on("b", request("b1", 8, 2, arrival_s=0.0)))
    core.submit(request("base", 8, 1, arrival_s=0.0))
    stats = core.stats()
    assert (stats.running, stats.waiting) == (2, 1)
    assert stats.running_adapters == ("a",) and stats.waiting_adapters == ("b",)
    events = _run(core, 1.0)
    assert_complete(events, {"a1": 3, "b1": 2, "base": 1})
    assert first_token_s(events, "base") == pytest.approx(0.1)
    assert first_token_s(events, "b1") == pytest.approx(0.12 + 0.1)  # starts at a1's last token
    assert [e.time_s for e in events] == sorted(e.time_s for e in events)
    assert core.stats().waiting == 0 and core.next_event_s() is None


def test_fixed_core_abort_of_the_blocker_starts_the_waiting_request_at_the_latest_time_seen() -> None:
    core = FixedDelayCore(first_token_delay_s=0.1, token_delay_s=0.01, max_loras=1)
    core.submit(on("a", request("a1", 8, 100, arrival_s=0.0)))
    core.submit(on("b", request("b1", 8, 1, arrival_s=0.5)))
    _run(core, 0.5)
    core.abort("a1")
    assert core.stats().running_adapters == ("b",)
    assert [(e.request_id, e.time_s) for e in _run(core, 2.0)] == [("b1", pytest.approx(0.6))]


def test_fixed_core_abort_of_a_waiting_request_drops_it() -> None:
    core = FixedDelayCore(first_token_delay_s=0.1, token_delay_s=0.01, max_loras=1)
    core.submit(on("a", request("a1", 8, 2)))
    core.submit(on("b", request("b1", 8, 2)))
    core.abort("b1")
    assert core.stats().waiting == 0
    assert {e.request_id for e in _run(core, 1.0)} == {"a1"}


def test_fixed_core_without_adapters_is_unchanged() -> None:
    core = FixedDelayCore(first_token_delay_s=0.1, token_delay_s=0.01)
    core.submit(request("r1", 8, 2))
    core.submit(request("r2", 8, 2))
    assert core.stats().waiting == 0 and core.stats().running == 2
    assert [round(e.time_s, 6) for e in _run(core, 1.0)] == [0.1, 0.1, 0.11, 0.11]
