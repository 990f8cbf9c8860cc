"""A per-replica latency model, learned online from the gateway's own observations.

Two linear models, each fitted by recursive least squares (RLS) with exponential forgetting:

    TTFT_s ≈ a0 + a1 · (queued_prefill_tokens / 1000) + a2 · (running / 10) + a3 · (waiting / 10)
             + a4 · (own_uncached_tokens / 1000) + a5 · (min(since_last_token_s, 0.5) / 0.1)
    TPOT_s ≈ b0 + b1 · (running / 10) + b2 · kv_usage_ratio

`queued_prefill_tokens` is the uncached prompt tokens dispatched to the replica that have not produced
their first token yet, *including the request's own* (what it waits behind, and its own prefill);
`own_uncached_tokens` is the request's own part of them; `waiting` is how many requests those are (its
own excluded); `running` is the sequences decoding on it; `since_last_token_s` is the time since the
gateway last relayed a streamed token from the replica (any request; 0 when none is decoding there
or none came yet: the term then adds nothing). Why linear: in a continuous-batching engine a
request joins the step after the one in flight, then its own step prefills its own tokens (chunked at
the engine's prefill rate) besides decoding the running batch, whose cost grows with the batch; when
the KV cache is full a request waits for running ones to finish whatever its size — which the count
of requests ahead carries and their tokens do not (with prefix hits they are few). Why the request's
own tokens get a term of their own (a4): they are paid in full (its own step), while the tokens ahead
are mostly in the step already in flight, of which the request waits on average half — so a token
ahead costs less than an own token (fitted, a1 comes out well below a4, and a1 + a4 near the
engine's cost of a prefilled token; docs/bench-log/2026-12-05-rounds.md, "Prediction error"). A decode step
reads the weights once plus every running sequence's KV (TPOT = weights/BW + Σ context · kv_bytes/BW),
so TPOT is affine in the batch and in the KV in use. The feature scales (/1000, /10) only keep the normal
equations well conditioned.

RLS with forgetting factor λ (default 0.98, an effective memory of about 1/(1−λ) = 50 observations)
and a weight w per sample:

    x' = √w · x,  y' = √w · y
    k = P x' / (λ + x'ᵀ P x');   θ ← θ + k (y' − x'ᵀ θ);   P ← (P − k x'ᵀ P) / λ

which minimises Σ λ^age · w · (y − xᵀθ)². The TTFT model weighs each sample by 1 / TTFT² (relative
least squares: it fits the *relative* error, the quantity the metric reports). Unweighted, the
few-hundred-millisecond TTFTs of prefix misses dominate the squares and the tens-of-milliseconds
TTFTs of hits, most of the requests, are predicted far too high (same section). The TPOT model is
unweighted (its samples vary little). Memory is fixed (a 6-vector and a 6×6 matrix, a 3-vector and
a 3×3 matrix), there is no sidecar and nothing grows with history; adapting to a
changed engine is what the forgetting is for. P starts at 1000 · I (a weak prior, θ = 0); P is
reset to the prior when its trace exceeds 1e6 (the "windup" of RLS under forgetting when an input
stops varying). A model is *warm* after `warm_after` observations (default 16); routing uses only
warm models' predictions. Predictions are clamped to ≥ 1 ms.

Why the time since the last token (a5): where in the step in flight the request arrives is uniform
over the step (tens of milliseconds on a hit, a few hundred while a miss's prefill runs) and on a hit
it is a large part of the TTFT; without it a prediction keeps an error no fit removes. A
continuous-batching engine emits its tokens at step ends, so the last token relayed from the replica
marks the start of the step in flight, and the time since then is the phase. It is used as it is
rather than as the time left, max(0, step − since): replayed on recorded engine step times the time
since the step began cuts the error, the time left computed from a mean step time does no better
than nothing (same section) — the steps' length varies tenfold (hits vs a miss's prefill), and a long
time since the last token also says a long step is running. Capped at 0.5 s (a replica idle that long
is not mid-step). Measured by the gateway the phase carries its relay delay (milliseconds, comparable
to a hit's step), which costs part of that gain.

Prediction error is tracked as an exponentially weighted mean absolute percentage error,
|predicted − actual| / actual, of the prediction the model made *before* learning from the sample
(weight 0.05 per sample), for warm models only; the gateway exports it as
`llm_gateway_latency_model_error_ratio{replica,target}`.

The TPOT model is a prediction, not a cap: solved for the batch whose TPOT meets the objective it was
tried as the replica's cap and capped replicas below the knee, because an affine law fitted over the
narrow range of batches a replica runs extrapolates badly (docs/bench-log/2026-12-05-rounds.md, "The cap
that finds itself"). The cap, when one is wanted, follows the measured TPOT instead
(`gateway.upstream.tpot_limit`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PREFILL_TOKENS_SCALE = 1000.0
RUNNING_SCALE = 10.0
DEFAULT_FORGETTING_FACTOR = 0.98
DEFAULT_WARM_AFTER = 16
PRIOR_VARIANCE = 1000.0
MAX_COVARIANCE_TRACE = 1e6
ERROR_WEIGHT = 0.05
STEP_PHASE_SCALE_S = 0.1
MAX_SINCE_LAST_TOKEN_S = 0.5
MIN_PREDICTION_S = 0.001


class OnlineLinearModel:
    """Recursive least squares with forgetting over a fixed number of features (module docstring)."""

    __slots__ = ("_cov", "_forgetting", "_theta", "samples")

    def __init__(self, dimensions: int, forgetting_factor: float = DEFAULT_FORGETTING_FACTOR) -> None:
        if not 0.0 < forgetting_factor <= 1.0:
            raise ValueError(f"forgetting_factor must be in (0, 1], got {forgetting_factor!r}")
        self._forgetting = forgetting_factor
        self._theta = [0.0] * dimensions
        self._cov = _scaled_identity(dimensions, PRIOR_VARIANCE)
        self.samples = 0

    @property
    def coefficients(self) -> tuple[float, ...]:
        """θ, in the order of the features."""
        return tuple(self._theta)

    def predict(self, features: Sequence[float]) -> float:
        """xᵀθ (unclamped)."""
        return sum(t * x for t, x in zip(self._theta, features, strict=True))

    def update(self, features: Sequence[float], actual: float, weight: float = 1.0) -> None:
        """One RLS step towards `actual` at `features`, the sample weighing `weight` (module
        docstring); non-finite samples and non-positive weights are ignored."""
        if not math.isfinite(actual) or not all(math.isfinite(x) for x in features):
            return
        if not (math.isfinite(weight) and weight > 0):
            return
        scale = math.sqrt(weight)
        features = [x * scale for x in features]
        actual *= scale
        cov, lam = self._cov, self._forgetting
        n = len(self._theta)
        p_x = [sum(cov[i][j] * features[j] for j in range(n)) for i in range(n)]
        denominator = lam + sum(features[i] * p_x[i] for i in range(n))
        if denominator <= 0:
            return
        gain = [v / denominator for v in p_x]
        error = actual - self.predict(features)
        for i in range(n):
            self._theta[i] += gain[i] * error
        # P ← (P − k (P x)ᵀ) / λ   (P is symmetric, so xᵀP = (P x)ᵀ)
        # Updated symmetrically (each pair once) so rounding never makes P asymmetric.
        for i in range(n):
            for j in range(i, n):
                value = (cov[i][j] - gain[i] * p_x[j]) / lam
                cov[i][j] = cov[j][i] = value
        self.samples += 1
        trace = sum(cov[i][i] for i in range(n))
        if trace > MAX_COVARIANCE_TRACE or min(cov[i][i] for i in range(n)) <= 0:
            self._cov = _scaled_identity(n, PRIOR_VARIANCE)


def _scaled_identity(n: int, value: float) -> list[list[float]]:
    return [[value if i == j else 0.0 for j in range(n)] for i in range(n)]


TTFT_FEATURES = 6
TPOT_FEATURES = 3


def ttft_features(
    queued_prefill_tokens: float,
    running: float,
    waiting: float = 0.0,
    own_uncached_tokens: float = 0.0,
    since_last_token_s: float = 0.0,
) -> tuple[float, ...]:
    """The TTFT model's inputs: (1, queued prefill tokens / 1000, running / 10, waiting / 10,
    own uncached tokens / 1000, min(since last token, 0.5 s) / 0.1 s). `own_uncached_tokens` 0 (a
    caller that does not know it) prices all the queued tokens as tokens ahead: a miss is then
    predicted short by a4 · its tokens. `since_last_token_s` 0 (unknown, or nothing decoding) adds
    nothing; negative values count as 0."""
    return (
        1.0,
        queued_prefill_tokens / PREFILL_TOKENS_SCALE,
        running / RUNNING_SCALE,
        waiting / RUNNING_SCALE,
        own_uncached_tokens / PREFILL_TOKENS_SCALE,
        min(max(0.0, since_last_token_s), MAX_SINCE_LAST_TOKEN_S) / STEP_PHASE_SCALE_S,
    )


def tpot_features(running: float, kv_usage_ratio: float) -> tuple[float, ...]:
    """The TPOT model's inputs: (1, running / 10, KV usage ratio)."""
    return (1.0, running / RUNNING_SCALE, kv_usage_ratio)


@dataclass(frozen=True, slots=True)
class LatencyEstimate:
    """A frozen copy of one replica's fitted coefficients, for routing (one per view).

    `ttft` / `tpot` are None while that model is cold (fewer than `warm_after` observations); when set
    they hold `TTFT_FEATURES` / `TPOT_FEATURES` coefficients, in the order of the features.
    """

    ttft: tuple[float, ...] | None = None
    tpot: tuple[float, ...] | None = None

    def ttft_s(
        self,
        queued_prefill_tokens: float,
        running: float,
        waiting: float = 0.0,
        own_uncached_tokens: float = 0.0,
        since_last_token_s: float = 0.0,
    ) -> float | None:
        """Predicted TTFT for a request with `own_uncached_tokens` to prefill that finds
        `queued_prefill_tokens` (its own included) in `waiting` requests ahead and `running` sequences
        on the replica, `since_last_token_s` after its last streamed token; None while cold."""
        if self.ttft is None:
            return None
        x = ttft_features(queued_prefill_tokens, running, waiting, own_uncached_tokens, since_last_token_s)
        return max(MIN_PREDICTION_S, sum(t * v for t, v in zip(self.ttft, x, strict=True)))

    def tpot_s(self, running: float, kv_usage_ratio: float) -> float | None:
        """Predicted TPOT with `running` sequences and `kv_usage_ratio` of the KV in use; None while cold."""
        if self.tpot is None:
            return None
        x = tpot_features(running, kv_usage_ratio)
        return max(MIN_PREDICTION_S, sum(t * v for t, v in zip(self.tpot, x, strict=True)))


class ErrorTracker:
    """Exponentially weighted mean absolute percentage error (weight `ERROR_WEIGHT` per sample)."""

    __slots__ = ("samples", "value")

    def __init__(self) -> None:
        self.value: float | None = None
        self.samples = 0

    def observe(self, predicted: float, actual: float) -> None:
        """Fold |predicted − actual| / actual in; ignored for a non-positive actual."""
        if actual <= 0:
            return
        error = abs(predicted - actual) / actual
        self.value = error if self.value is None else self.value + ERROR_WEIGHT * (error - self.value)
        self.samples += 1


class ReplicaLatencyModel:
    """Both models of one replica, their error trackers, and the estimate routing reads."""

    __slots__ = ("_estimate", "_warm_after", "tpot", "tpot_error", "ttft", "ttft_error")

    def __init__(
        self,
        forgetting_factor: float = DEFAULT_FORGETTING_FACTOR,
        warm_after: int = DEFAULT_WARM_AFTER,
    ) -> None:
        self.ttft = OnlineLinearModel(TTFT_FEATURES, forgetting_factor)
        self.tpot = OnlineLinearModel(TPOT_FEATURES, forgetting_factor)
        self.ttft_error = ErrorTracker()
        self.tpot_error = ErrorTracker()
        self._warm_after = warm_after
        self._estimate = LatencyEstimate()

    @property
    def estimate(self) -> LatencyEstimate:
        """The current frozen estimate (rebuilt after each observation, so views share it)."""
        return self._estimate

    def observe_ttft(
        self,
        queued_prefill_tokens: float,
        running: float,
        ttft_s: float,
        waiting: float = 0.0,
        own_uncached_tokens: float = 0.0,
        *,
        since_last_token_s: float = 0.0,
    ) -> None:
        """Learn from one request's first token: what it found at dispatch, and its TTFT (weighted
        1 / TTFT², module docstring; a non-positive TTFT teaches nothing)."""
        found = (queued_prefill_tokens, running, waiting, own_uncached_tokens, since_last_token_s)
        predicted = self._estimate.ttft_s(*found)
        if predicted is not None:
            self.ttft_error.observe(predicted, ttft_s)
        if ttft_s > 0:
            x = ttft_features(*found)
            self.ttft.update(x, ttft_s, weight=1.0 / (ttft_s * ttft_s))
        self._refresh()

    def observe_tpot(self, running: float, kv_usage_ratio: float, tpot_s: float) -> None:
        """Learn from one request's decode: the batch and KV use while it decoded, and its TPOT."""
        predicted = self._estimate.tpot_s(running, kv_usage_ratio)
        if predicted is not None:
            self.tpot_error.observe(predicted, tpot_s)
        self.tpot.update(tpot_features(running, kv_usage_ratio), tpot_s)
        self._refresh()

    def _refresh(self) -> None:
        self._estimate = LatencyEstimate(
            ttft=self.ttft.coefficients if self.ttft.samples >= self._warm_after else None,
            tpot=self.tpot.coefficients if self.tpot.samples >= self._warm_after else None,
        )
