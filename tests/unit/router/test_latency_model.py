"""The online latency model: it recovers a known affine law (the request's own prefill priced apart
from the tokens ahead), fits relative error, forgets an old law, and reports its error."""

from __future__ import annotations

import math
import random

import pytest

from router.latency_model import (
    TTFT_FEATURES,
    ErrorTracker,
    LatencyEstimate,
    OnlineLinearModel,
    ReplicaLatencyModel,
    tpot_features,
    ttft_features,
)


def _ttft_law(queued_tokens: float, running: float) -> float:
    """An engine that prefills 16,000 tokens/s and spends 1 ms per running sequence per prefill."""
    return 0.02 + queued_tokens / 16_000 + 0.001 * running


def test_recovers_a_noiseless_affine_law() -> None:
    """Tokens ahead cost half an own token (half the step in flight is left on average); the step in
    flight, 60 ms long, has `since` of it done when the request arrives: 60 ms − since is left."""
    rng = random.Random(1)
    model = OnlineLinearModel(TTFT_FEATURES, forgetting_factor=1.0)
    for _ in range(300):
        ahead, own = rng.uniform(0, 20_000), rng.uniform(100, 4_000)
        r, w, since = rng.uniform(0, 100), rng.uniform(0, 30), rng.uniform(0, 0.06)
        actual = _ttft_law(ahead / 2 + own, r) + 0.05 * w + 0.06 - since
        model.update(ttft_features(ahead + own, r, w, own, since), actual)
    a0, a1, a2, a3, a4, a5 = model.coefficients
    assert a0 == pytest.approx(0.02 + 0.06, abs=1e-3)
    assert a5 == pytest.approx(-0.1, rel=1e-3)  # per 0.1 s since the last token
    assert a1 == pytest.approx(500 / 16_000, rel=1e-3)  # per 1,000 queued tokens
    assert a4 == pytest.approx(500 / 16_000, rel=1e-3)  # own tokens: a1 + a4 = 1 / prefill rate
    assert a2 == pytest.approx(0.01, rel=1e-2)  # per 10 running
    assert a3 == pytest.approx(0.5, rel=1e-2)  # per 10 waiting


def test_a_weighted_update_minimises_the_weighted_squares() -> None:
    """A constant fitted to 1 and 3 with weights 1/y² is Σ(1/y) / Σ(1/y²) = 1.2, not the mean 2."""
    weighted, plain = OnlineLinearModel(1, forgetting_factor=1.0), OnlineLinearModel(1, forgetting_factor=1.0)
    for _ in range(100):
        for y in (1.0, 3.0):
            weighted.update((1.0,), y, weight=1 / y**2)
            plain.update((1.0,), y)
    assert weighted.coefficients[0] == pytest.approx(1.2, rel=1e-3)
    assert plain.coefficients[0] == pytest.approx(2.0, rel=1e-3)
    weighted.update((1.0,), 50.0, weight=0.0)
    weighted.update((1.0,), 50.0, weight=math.nan)
    assert weighted.samples == 200  # a non-positive or non-finite weight teaches nothing


def test_the_ttft_model_fits_relative_error() -> None:
    """Many short TTFTs and a few long ones at the same features: the fit sits near the short ones
    (relative least squares: Σ(1/y) / Σ(1/y²)), where the unweighted mean would be 2.6× them."""
    model = ReplicaLatencyModel(forgetting_factor=1.0, warm_after=1)
    for i in range(200):
        model.observe_ttft(1000, 0, 0.3 if i % 5 == 0 else 0.05)
    mean = (4 * 0.05 + 0.3) / 5
    relative = (4 / 0.05 + 1 / 0.3) / (4 / 0.05**2 + 1 / 0.3**2)
    predicted = model.estimate.ttft_s(1000, 0)
    assert predicted == pytest.approx(relative, rel=0.02)
    assert predicted < 0.06 < mean
    model.observe_ttft(1000, 0, 0.0)  # a zero TTFT teaches nothing (and is no error sample)
    assert model.ttft.samples == 200


def test_forgetting_follows_a_changed_engine() -> None:
    """After the engine becomes twice as slow, the model's predictions follow within a few memories."""
    rng = random.Random(2)
    model = ReplicaLatencyModel(forgetting_factor=0.95, warm_after=8)
    for _ in range(200):
        q, r = rng.uniform(0, 20_000), rng.uniform(0, 100)
        model.observe_ttft(q, r, _ttft_law(q, r))
    for _ in range(200):
        q, r = rng.uniform(0, 20_000), rng.uniform(0, 100)
        model.observe_ttft(q, r, 2 * _ttft_law(q, r))
    predicted = model.estimate.ttft_s(8_000, 50)
    assert predicted == pytest.approx(2 * _ttft_law(8_000, 50), rel=0.02)


def test_cold_until_warm_and_error_tracked_only_when_warm() -> None:
    model = ReplicaLatencyModel(warm_after=4)
    for i in range(3):
        model.observe_ttft(1000.0 * i, 1.0, _ttft_law(1000.0 * i, 1.0))
    assert model.estimate.ttft is None and model.estimate.ttft_s(1000, 1) is None
    assert model.ttft_error.value is None
    for i in range(3, 40):
        q = 500.0 * (i % 7)
        r = float(i % 5)
        model.observe_ttft(q, r, _ttft_law(q, r))
    assert model.estimate.ttft is not None
    assert model.ttft_error.value is not None and model.ttft_error.value < 0.05
    assert model.estimate.tpot is None  # the TPOT model saw nothing


def test_noisy_samples_keep_the_error_near_the_noise() -> None:
    """With ±10 % multiplicative noise the tracked MAPE settles near the noise's mean (5 %)."""
    rng = random.Random(3)
    model = ReplicaLatencyModel()
    for _ in range(2000):
        q, r = rng.uniform(0, 20_000), rng.uniform(0, 100)
        model.observe_ttft(q, r, _ttft_law(q, r) * rng.uniform(0.9, 1.1))
    assert model.ttft_error.value is not None
    assert 0.02 < model.ttft_error.value < 0.09


def test_non_finite_samples_are_ignored() -> None:
    model = OnlineLinearModel(3)
    model.update((1.0, math.nan, 0.0), 1.0)
    model.update((1.0, 1.0, 0.0), math.inf)
    assert model.samples == 0 and model.coefficients == (0.0, 0.0, 0.0)


def test_predictions_are_clamped_positive() -> None:
    estimate = LatencyEstimate(ttft=(-1.0, 0.0, 0.0, 0.0, 0.0, 0.0), tpot=(-1.0, 0.0, 0.0))
    assert estimate.ttft_s(0, 0) == pytest.approx(0.001)
    assert estimate.tpot_s(0, 0) == pytest.approx(0.001)


def test_the_time_since_the_last_token_is_capped_and_never_negative() -> None:
    """0.5 s since the last token says the replica is not mid-step: longer counts as 0.5 s; a negative
    time (clocks) as 0; the default 0 adds nothing."""
    assert ttft_features(0, 0, since_last_token_s=0.03)[5] == pytest.approx(0.3)
    assert ttft_features(0, 0, since_last_token_s=7.0)[5] == pytest.approx(5.0)
    assert ttft_features(0, 0, since_last_token_s=-1.0)[5] == 0.0
    assert ttft_features(0, 0)[5] == 0.0


def test_error_tracker_ignores_non_positive_actuals() -> None:
    tracker = ErrorTracker()
    tracker.observe(1.0, 0.0)
    assert tracker.value is None
    tracker.observe(1.5, 1.0)
    assert tracker.value == pytest.approx(0.5)
    assert tpot_features(10, 0.5) == (1.0, 1.0, 0.5)


def test_learns_the_tpot_law() -> None:
    rng = random.Random(4)
    model = ReplicaLatencyModel()
    for _ in range(300):
        r = rng.uniform(1, 120)
        model.observe_tpot(r, r / 200, 0.008 + 0.0003 * r)
    assert model.estimate.tpot_s(60, 0.3) == pytest.approx(0.008 + 0.0003 * 60, rel=0.01)
    assert model.tpot_error.value is not None and model.tpot_error.value < 0.01
