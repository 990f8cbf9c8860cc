"""What requests cost one replica: token-aware load and its learned latency model.

Counted by the slots (`gateway.upstream.slot`), read by routing through the replica's view:

- `prefill_tokens_inflight`: Σ uncached prompt tokens of the requests dispatched here that have not
  produced their first token. A request's uncached tokens are its estimated prompt tokens minus the
  prefix blocks the router expected the replica to hold (`RoutingRequest.uncached_tokens` of the
  decision's `matched_prefix_blocks`; the whole prompt when the policy keeps no prefix index). A
  non-streamed request shows no first token: its tokens stay counted until it ends.
- `decoding_requests`: requests past their first token, still running.
- `last_token_s`: when the proxy last relayed a streamed token from the replica (any request;
  `token_relayed`, once per chunk after a stream's first token, read from the injected `clock`, by
  default the system's monotonic one, the pools' in production). An engine emits tokens at step
  ends, so `since_last_token_s()` — now minus that, or 0 while no request decodes here or none has
  streamed — is the phase of the step in flight, a TTFT input.

Learning (`router.latency_model`), from the gateway's own observations, only of streamed requests
that succeed: at the first content token, TTFT since dispatch (the replica's part, not the admission
queue's) against what the request found at dispatch — queued prefill tokens, its own included, its own
uncached tokens, the requests ahead without a first token and the running batch (the gateway's
counts, or the engine's fresh `waiting` / `running` when larger), the time since the replica's last
token; at the end, TPOT = (end − first token) / (output tokens − 1) against the mean of the batch at
its first token and at its end, and the engine's KV use. The learned cap follows each TPOT sample
(`gateway.upstream.latency_settings`): the gradient limit of the measured TPOT
(`gateway.upstream.tpot_limit`) once the objective has been broken, none before — and none while
`cached_share` is at or above `cap_max_cached_share`.

`cached_share`: the share of the prompt tokens dispatched here that the router expected the replica to
hold (1 − uncached / prompt), an exponentially weighted mean over dispatches (weight
`CACHED_SHARE_WEIGHT` = 0.02, about the last 50), None before the first dispatch with a known prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.clock import Clock, SystemClock
from gateway.upstream.latency_settings import LatencyModelSettings
from gateway.upstream.tpot_limit import TpotConcurrencyLimit
from router.latency_model import LatencyEstimate, ReplicaLatencyModel
from router.load import fresh_sample
from router.types import EngineLoad

CACHED_SHARE_WEIGHT = 0.02


@dataclass(frozen=True, slots=True)
class DispatchSample:
    """What a request found on the replica when it was dispatched there."""

    uncached_tokens: int
    queued_prefill_tokens: int
    running: float
    waiting: float
    since_last_token_s: float = 0.0


class ReplicaCost:
    """One replica's token-aware load, latency model and learned cap (module docstring)."""

    __slots__ = (
        "_cap_max_cached_share",
        "_clock",
        "_tpot_limit",
        "cached_share",
        "decoding_requests",
        "last_token_s",
        "learned_cap",
        "model",
        "prefill_tokens_inflight",
    )

    def __init__(
        self,
        settings: LatencyModelSettings | None = None,
        *,
        tpot_slo_s: float | None = None,
        configured_cap: int | None = None,
        clock: Clock | None = None,
    ) -> None:
        settings = settings or LatencyModelSettings()
        self.prefill_tokens_inflight = 0
        self.decoding_requests = 0
        self._clock: Clock = clock or SystemClock()
        self.last_token_s: float | None = None
        self.learned_cap: int | None = None
        self.cached_share: float | None = None
        self._cap_max_cached_share = settings.cap_max_cached_share
        self.model: ReplicaLatencyModel | None = None
        self._tpot_limit: TpotConcurrencyLimit | None = None
        if settings.enabled:
            self.model = ReplicaLatencyModel(settings.forgetting_factor, settings.warm_after)
            if settings.adaptive_cap and tpot_slo_s is not None:
                self._tpot_limit = TpotConcurrencyLimit(
                    tpot_slo_s,
                    min_limit=settings.min_cap_per_replica,
                    max_limit=configured_cap,
                    target_ratio=settings.tpot_target_ratio,
                )

    @property
    def estimate(self) -> LatencyEstimate | None:
        """The model's frozen estimate for routing; None when the pool learns none."""
        return None if self.model is None else self.model.estimate

    def running(self, engine: EngineLoad | None) -> float:
        """The decode batch: the gateway's count, or the engine's fresh `running` when larger."""
        return max(float(self.decoding_requests), fresh_sample(engine).running)

    def token_relayed(self) -> None:
        """The proxy relayed a streamed token from this replica (hot path: one clock read, one store)."""
        self.last_token_s = self._clock.now_s()

    def since_last_token_s(self) -> float:
        """Seconds since the last relayed token; 0 (neutral: the model's term adds nothing) while no
        request decodes here — an idle replica is in no step — or before any token."""
        if self.last_token_s is None or self.decoding_requests <= 0:
            return 0.0
        return max(0.0, self._clock.now_s() - self.last_token_s)

    def dispatched(
        self,
        uncached_tokens: int,
        engine: EngineLoad | None,
        *,
        inflight: int,
        prompt_tokens: int | None = None,
    ) -> DispatchSample:
        """A request with `uncached_tokens` to prefill (of `prompt_tokens`, when known) is sent here,
        where `inflight` requests already run: count it, return what it found (requests ahead without a
        first token: `inflight` minus the decoding ones, or the engine's fresh `waiting` when larger)."""
        if prompt_tokens is not None and prompt_tokens > 0:
            share = 1.0 - min(uncached_tokens, prompt_tokens) / prompt_tokens
            last = self.cached_share
            self.cached_share = share if last is None else last + CACHED_SHARE_WEIGHT * (share - last)
        prefilling = max(0, inflight - self.decoding_requests)
        sample = DispatchSample(
            uncached_tokens=uncached_tokens,
            queued_prefill_tokens=self.prefill_tokens_inflight + uncached_tokens,
            running=self.running(engine),
            waiting=max(float(prefilling), fresh_sample(engine).waiting),
            since_last_token_s=self.since_last_token_s(),
        )
        self.prefill_tokens_inflight += uncached_tokens
        return sample

    def first_token(self, sample: DispatchSample, ttft_s: float | None) -> None:
        """The request's first token: its prefill is done; learn from its TTFT when given."""
        self.prefill_tokens_inflight -= sample.uncached_tokens
        self.decoding_requests += 1
        if self.model is not None and ttft_s is not None:
            self.model.observe_ttft(
                sample.queued_prefill_tokens,
                sample.running,
                ttft_s,
                sample.waiting,
                sample.uncached_tokens,
                since_last_token_s=sample.since_last_token_s,
            )

    def ended(self, sample: DispatchSample, *, decoding: bool) -> None:
        """The request left the replica, in prefill (`decoding` False) or while decoding."""
        if decoding:
            self.decoding_requests -= 1
        else:
            self.prefill_tokens_inflight -= sample.uncached_tokens

    def learn_tpot(self, running: float, engine: EngineLoad | None, tpot_s: float, inflight: int = 0) -> None:
        """Learn one TPOT sample (with `inflight` requests on the replica now) and move the cap."""
        if self.model is None:
            return
        kv_usage = fresh_sample(engine).kv_usage_ratio
        self.model.observe_tpot(running, kv_usage, tpot_s)
        limit = self._tpot_limit
        if limit is None:
            return
        if self.cached_share is not None and self.cached_share >= self._cap_max_cached_share:
            limit.reset()  # prefix affinity at work: a cap would spill requests to cold replicas
        else:
            limit.observe(tpot_s, inflight)
        self.learned_cap = limit.cap
