"""What requests cost one replica: token-aware load and its learned latency model.

Counted by the slots (`gateway.upstream.slot`), read by routing through the replica's view:

- `prefill_tokens_inflight`: Σ uncached prompt tokens of the requests dispatched here that have not
  produced their first token. A request's uncached tokens are its estimated prompt tokens minus the
  prefix blocks the router expected the replica to hold (`RoutingRequest.uncached_tokens` of the
  decision's `matched_prefix_blocks`; the whole prompt when the policy keeps no prefix index). A
  non-streamed request shows no first token: its tokens stay counted until it ends.
- `decoding_requests`: requests past their first token, still running.

Learning (`router.latency_model`), from the gateway's own observations, only of streamed requests
that succeed: at the first content token, TTFT since dispatch (the replica's part, not the admission
queue's) against what the request found at dispatch — queued prefill tokens, its own included, and the
running batch (the gateway's count, or the engine's fresh `running` when larger); at the end, TPOT =
(end − first token) / (output tokens − 1) against the mean of the batch at its first token and at its
end, and the engine's KV use. The learned cap follows each TPOT sample
(`gateway.upstream.latency_settings`): the gradient limit of the measured TPOT
(`gateway.upstream.tpot_limit`) once the objective has been broken, none before.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.upstream.latency_settings import LatencyModelSettings
from gateway.upstream.tpot_limit import TpotConcurrencyLimit
from router.latency_model import LatencyEstimate, ReplicaLatencyModel
from router.types import EngineLoad


@dataclass(frozen=True, slots=True)
class DispatchSample:
    """What a request found on the replica when it was dispatched there."""

    uncached_tokens: int
    queued_prefill_tokens: int
    running: float
    waiting: float


def engine_running(engine: EngineLoad | None) -> float:
    """The engine's fresh `running`, 0 without a fresh sample."""
    return 0.0 if engine is None or engine.stale else engine.running


def engine_kv_usage(engine: EngineLoad | None) -> float:
    """The engine's fresh KV-cache usage ratio, 0 without a fresh sample."""
    return 0.0 if engine is None or engine.stale else engine.kv_usage_ratio


class ReplicaCost:
    """One replica's token-aware load, latency model and learned cap (module docstring)."""

    __slots__ = (
        "_configured_cap",
        "_settings",
        "_tpot_limit",
        "_tpot_slo_s",
        "decoding_requests",
        "learned_cap",
        "model",
        "prefill_tokens_inflight",
        "prefilling_requests",
    )

    def __init__(
        self,
        settings: LatencyModelSettings | None = None,
        *,
        tpot_slo_s: float | None = None,
        configured_cap: int | None = None,
    ) -> None:
        self._settings = settings or LatencyModelSettings()
        self._tpot_slo_s = tpot_slo_s
        self._configured_cap = configured_cap
        self.prefill_tokens_inflight = 0
        self.prefilling_requests = 0
        self.decoding_requests = 0
        self.learned_cap: int | None = None
        self.model: ReplicaLatencyModel | None = None
        self._tpot_limit: TpotConcurrencyLimit | None = None
        if self._settings.enabled:
            self.model = ReplicaLatencyModel(self._settings.forgetting_factor, self._settings.warm_after)
            if self._settings.adaptive_cap and tpot_slo_s is not None:
                self._tpot_limit = TpotConcurrencyLimit(
                    tpot_slo_s, min_limit=self._settings.min_cap_per_replica, max_limit=configured_cap
                )

    @property
    def estimate(self) -> LatencyEstimate | None:
        """The model's frozen estimate for routing; None when the pool learns none."""
        return None if self.model is None else self.model.estimate

    def running(self, engine: EngineLoad | None) -> float:
        """The decode batch: the gateway's count, or the engine's fresh `running` when larger."""
        return max(float(self.decoding_requests), engine_running(engine))

    def waiting(self, engine: EngineLoad | None) -> float:
        """Requests ahead without a first token: the gateway's count, or the engine's fresh `waiting`
        when larger."""
        engine_waiting = 0.0 if engine is None or engine.stale else engine.waiting
        return max(float(self.prefilling_requests), engine_waiting)

    def dispatched(self, uncached_tokens: int, engine: EngineLoad | None) -> DispatchSample:
        """A request with `uncached_tokens` to prefill is sent here: count it, return what it found."""
        sample = DispatchSample(
            uncached_tokens=uncached_tokens,
            queued_prefill_tokens=self.prefill_tokens_inflight + uncached_tokens,
            running=self.running(engine),
            waiting=self.waiting(engine),
        )
        self.prefill_tokens_inflight += uncached_tokens
        self.prefilling_requests += 1
        return sample

    def first_token(self, sample: DispatchSample, ttft_s: float | None) -> None:
        """The request's first token: its prefill is done; learn from its TTFT when given."""
        self.prefill_tokens_inflight -= sample.uncached_tokens
        self.prefilling_requests -= 1
        self.decoding_requests += 1
        if self.model is not None and ttft_s is not None:
            self.model.observe_ttft(sample.queued_prefill_tokens, sample.running, ttft_s, sample.waiting)

    def ended(self, sample: DispatchSample, *, decoding: bool) -> None:
        """The request left the replica, in prefill (`decoding` False) or while decoding."""
        if decoding:
            self.decoding_requests -= 1
        else:
            self.prefill_tokens_inflight -= sample.uncached_tokens
            self.prefilling_requests -= 1

    def learn_tpot(self, running: float, engine: EngineLoad | None, tpot_s: float, inflight: int = 0) -> None:
        """Learn one TPOT sample (with `inflight` requests on the replica now) and move the cap."""
        if self.model is None:
            return
        kv_usage = engine_kv_usage(engine)
        self.model.observe_tpot(running, kv_usage, tpot_s)
        if self._tpot_limit is not None:
            self._tpot_limit.observe(tpot_s, inflight)
        self._update_cap()

    def _update_cap(self) -> None:
        """The learned cap is the gradient limit's (None until the TPOT objective has been broken).

        The TPOT model's solved batch (`LatencyEstimate.max_batch_for_tpot`) is not used as a cap: on
        the long-prompt regime of docs/BENCHMARKS.md it capped replicas below the knee (16 req/s: 47
        refusals and 91 % of the SLO met, against none and 100 % without it), because the affine law
        fitted over a narrow range of batches extrapolates badly.
        """
        if self._tpot_limit is not None:
            self.learned_cap = self._tpot_limit.cap
