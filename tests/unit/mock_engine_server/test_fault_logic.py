"""The pure fault logic: validation, per-request decisions, determinism under a seed."""

from __future__ import annotations

import math
import random
from dataclasses import fields

import pytest

from mock_engine.faults import (
    DRAWS_PER_REQUEST,
    POISON_ERROR_MESSAGE,
    Draws,
    FaultInjector,
    FaultPlan,
    FaultSettings,
    FaultSettingsError,
    decide,
)

ALL_ON = FaultSettings(
    error_rate=0.2,
    error_status=503,
    retry_after_s=1.5,
    slow_first_token_ms=50,
    slow_first_token_rate=0.5,
    stall_after_tokens=3,
    stall_rate=0.3,
    crash_after_tokens=5,
    crash_rate=0.3,
    jitter_ms=10,
)


def draws(error: float = 0.9, slow: float = 0.9, stall: float = 0.9, crash: float = 0.9) -> Draws:
    return Draws(error, slow, stall, crash, jitter_seed=123)


def test_defaults_inject_nothing() -> None:
    plan = decide(FaultSettings(), draws(0.0, 0.0, 0.0, 0.0))
    assert plan == FaultPlan(jitter_seed=123)
    assert plan.interruption(0) is None and plan.jitter().next_s() == 0.0


def test_error_excludes_every_other_fault() -> None:
    plan = decide(ALL_ON, draws(error=0.1, slow=0.0, stall=0.0, crash=0.0))
    assert plan.error_status == 503 and plan.first_token_delay_s == 0.0
    assert plan.stall_after_tokens is None and plan.crash_after_tokens is None
    assert plan.retry_after_header() == "2"  # whole seconds, rounded up


@pytest.mark.parametrize(("status", "header"), [(429, "1"), (503, "1"), (500, None), (502, None)])
def test_retry_after_only_for_429_and_503(status: int, header: str | None) -> None:
    settings = FaultSettings(error_rate=1.0, error_status=status, retry_after_s=1)
    assert decide(settings, draws(error=0.99)).retry_after_header() == header


def test_retry_after_absent_when_not_configured() -> None:
    assert decide(FaultSettings(error_rate=1, error_status=429), draws()).retry_after_header() is None


def test_each_fault_follows_its_own_draw_and_rate() -> None:
    plan = decide(ALL_ON, draws(error=0.2, slow=0.49, stall=0.29, crash=0.3))
    assert plan.error_status is None  # 0.2 is not < 0.2
    assert plan.first_token_delay_s == pytest.approx(0.05)
    assert plan.stall_after_tokens == 3
    assert plan.crash_after_tokens is None
    assert plan.jitter_ms == 10


def test_rate_one_always_and_rate_zero_never() -> None:
    always = FaultSettings(stall_after_tokens=0, crash_after_tokens=2, slow_first_token_ms=1)
    assert decide(always, draws(0.999, 0.999, 0.999, 0.999)).stall_after_tokens == 0
    never = FaultSettings(
        stall_after_tokens=0, stall_rate=0.0, slow_first_token_ms=5, slow_first_token_rate=0
    )
    plan = decide(never, draws(0.0, 0.0, 0.0, 0.0))
    assert plan.stall_after_tokens is None and plan.first_token_delay_s == 0.0


def test_interruption_after_n_tokens_and_crash_wins_a_tie() -> None:
    plan = FaultPlan(stall_after_tokens=2, crash_after_tokens=4)
    assert [plan.interruption(n) for n in range(6)] == [None, None, "stall", None, "crash", None]
    assert FaultPlan(stall_after_tokens=3, crash_after_tokens=3).interruption(3) == "crash"


def test_jitter_is_bounded_and_seeded() -> None:
    first = [FaultPlan(jitter_ms=20, jitter_seed=7).jitter() for _ in range(2)]
    a = [first[0].next_s() for _ in range(200)]
    b = [first[1].next_s() for _ in range(200)]
    assert a == b
    assert all(0.0 <= x <= 0.020 for x in a) and max(a) > 0.015 and min(a) < 0.005
    assert a != [FaultPlan(jitter_ms=20, jitter_seed=8).jitter().next_s() for _ in range(200)]


def test_same_seed_same_plans() -> None:
    one = FaultInjector(ALL_ON, random.Random(42))
    two = FaultInjector(ALL_ON, random.Random(42))
    plans = [one.plan() for _ in range(200)]
    assert plans == [two.plan() for _ in range(200)]
    assert plans != [FaultInjector(ALL_ON, random.Random(43)).plan() for _ in range(200)]


def test_rates_are_respected_over_many_requests() -> None:
    injector = FaultInjector(ALL_ON, random.Random(1))
    plans = [injector.plan() for _ in range(5000)]
    errors = sum(p.error_status is not None for p in plans)
    served = [p for p in plans if p.error_status is None]
    assert errors / len(plans) == pytest.approx(0.2, abs=0.02)
    assert sum(p.first_token_delay_s > 0 for p in served) / len(served) == pytest.approx(0.5, abs=0.03)
    assert sum(p.stall_after_tokens is not None for p in served) / len(served) == pytest.approx(0.3, abs=0.03)


def test_draw_count_per_request_does_not_depend_on_settings() -> None:
    """Changing the settings at run time never shifts the decisions of later requests."""
    rng_a, rng_b = random.Random(5), random.Random(5)
    FaultInjector(FaultSettings(), rng_a).plan()
    FaultInjector(ALL_ON, rng_b).plan()
    assert rng_a.random() == rng_b.random()
    rng = random.Random(5)
    Draws.take(rng)
    reference = random.Random(5)
    for _ in range(DRAWS_PER_REQUEST - 1):
        reference.random()
    reference.getrandbits(64)
    assert rng.random() == reference.random()


def test_updated_applies_a_partial_change_and_coerces_json_numbers() -> None:
    new = FaultSettings().updated({"error_rate": 1, "stall_after_tokens": 4.0, "jitter_ms": 3})
    assert new.error_rate == 1.0 and isinstance(new.error_rate, float)
    assert new.stall_after_tokens == 4 and isinstance(new.stall_after_tokens, int)
    assert new.jitter_ms == 3.0 and new.error_status == 500
    assert new.updated({"stall_after_tokens": None}).stall_after_tokens is None
    assert FaultSettings().updated({}) == FaultSettings()


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"nope": 1}, "nope", "unknown fault field"),
        ({"error_rate": 1.5}, "error_rate", "within [0, 1]"),
        ({"error_rate": "0.5"}, "error_rate", "must be a number"),
        ({"error_rate": True}, "error_rate", "must be a number"),
        ({"error_rate": math.nan}, "error_rate", "within [0, 1]"),
        ({"error_status": 200}, "error_status", "400-599"),
        ({"error_status": 503.5}, "error_status", "must be an integer"),
        ({"error_status": None}, "error_status", "cannot be null"),
        ({"retry_after_s": -1}, "retry_after_s", ">= 0"),
        ({"slow_first_token_ms": -5}, "slow_first_token_ms", ">= 0"),
        ({"stall_after_tokens": -1}, "stall_after_tokens", ">= 0"),
        ({"crash_rate": 2}, "crash_rate", "within [0, 1]"),
        ({"jitter_ms": math.inf}, "jitter_ms", "finite"),
        ({"refuse_connections": 1}, "refuse_connections", "true or false"),
        ({"refuse_for_s": 0}, "refuse_for_s", "> 0"),
        ({"poison_marker": ""}, "poison_marker", "non-empty string"),
        ({"poison_marker": 5}, "poison_marker", "must be a string"),
        ({"poison_effect": "explode"}, "poison_effect", "one of stall, error, crash"),
        ({"poison_effect": None}, "poison_effect", "cannot be null"),
    ],
)
def test_invalid_changes_name_the_field(changes: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(FaultSettingsError) as caught:
        FaultSettings().updated(changes)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_body_must_be_an_object() -> None:
    with pytest.raises(FaultSettingsError, match="JSON object"):
        FaultSettings().updated([1, 2])  # type: ignore[arg-type]


def test_constructor_validates_too() -> None:
    with pytest.raises(FaultSettingsError):
        FaultSettings(stall_rate=-0.1)


def test_as_dict_round_trips_every_field() -> None:
    data = ALL_ON.as_dict()
    assert set(data) == {f.name for f in fields(FaultSettings)}
    assert FaultSettings().updated(data) == ALL_ON


# --- poison prompts -----------------------------------------------------------------------------------

POISONED = FaultSettings(poison_marker="!poison!")


@pytest.mark.parametrize(
    ("effect", "expected"),
    [
        ("stall", FaultPlan(stall_after_tokens=0, poisoned=True)),
        ("crash", FaultPlan(crash_after_tokens=0, poisoned=True)),
        ("error", FaultPlan(error_status=500, poisoned=True)),
    ],
)
def test_a_poisoned_request_gets_its_effect_and_nothing_else(effect: str, expected: FaultPlan) -> None:
    settings = ALL_ON.updated({"poison_marker": "!poison!", "poison_effect": effect})
    plan = decide(settings, draws(0.0, 0.0, 0.0, 0.0), poisoned=True)
    assert plan == expected and plan.retry_after_header() is None
    assert plan.error_message() == POISON_ERROR_MESSAGE
    assert plan.interruption(0) == (None if effect == "error" else effect)


def test_poisons_matches_the_marker_in_generation_prompts_only() -> None:
    assert POISONED.poisons("a !poison! b") and POISONED.poisons("!poison!")
    assert not POISONED.poisons("a !poison b") and not POISONED.poisons(None)
    assert not FaultSettings().poisons("!poison!"), "no marker: off"


def test_poisoned_requests_take_the_same_draws_as_any_other() -> None:
    settings = ALL_ON.updated({"poison_marker": "!poison!"})
    mixed = FaultInjector(settings, random.Random(8))
    clean = FaultInjector(ALL_ON, random.Random(8))
    prompts = ["!poison!" if i % 4 == 0 else f"p{i}" for i in range(400)]
    for prompt in prompts:
        got, unpoisoned = mixed.plan(prompt), clean.plan(prompt)
        if "!poison!" in prompt:
            assert got == FaultPlan(stall_after_tokens=0, poisoned=True)
        else:
            assert got == unpoisoned
    assert FaultInjector(settings, random.Random(8)).plan() == FaultInjector(ALL_ON, random.Random(8)).plan()
