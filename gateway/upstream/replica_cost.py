"""What requests cost one replica: token-aware load and its learned latency model.

Counted by the slots (`gateway.upstream.slot`), read by routing through the replica's view:

- `prefill_tokens_inflight`: Σ uncached prompt tokens of the requests dispatched here that have not
  produced their first token. A request's uncached tokens are its estimated prompt tokens minus the
  prefix blocks the router expected the replica to hold (`RoutingRequest.uncached_tokens` of the
  decision's `detail["matched_prefix_blocks"]`; the whole prompt when the policy keeps no prefix
  index — round robin, least-load, power-of-two; the ring pickers keep one as a witness,
  `router.bounded`). A
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
its first token and at its end, and the engine's KV use.

The learned cap (`gateway.config.latency_settings`, rules in `gateway.upstream.tpot_limit`): each
fresh scrape (`engine_sampled`) records the requests other senders run on the engine
(`foreign_requests`: engine running + waiting − this instance's in-flight) and this instance's share
of the engine's batch (`own_share`: in-flight ÷ max(in-flight, batch), an exponentially weighted mean
over scrapes, weight `OWN_SHARE_WEIGHT` = 0.1; 1 without scrapes), and, when the scrape closed a
token-latency window, moves the cap on the engine's whole batch; without such windows each finished
stream's TPOT moves it (`learn_tpot`; with them it trims the set point at the pace `own_share` sets).
None while `affinity_share` is at or above `cap_max_affinity_share`, when that gate is set (off by
default).

`affinity_share`: the share of the prompt tokens dispatched here that some replicas of the pool were
expected to hold and others not — (tokens the best-placed replica holds − tokens the worst-placed one
holds) / prompt, from the prefix index over the whole pool, whichever replica the request went to — an
exponentially weighted mean over dispatches (weight `AFFINITY_SHARE_WEIGHT` = 0.02, about the last 50);
None while no dispatch said (policies without a prefix index). A prompt every replica holds (one
system prompt for all) counts for nothing, and neither does a unique one. It is taken over the whole
pool rather than from what this replica cached: a cap's own spills would read as a workload without
sharing.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.clock import Clock, SystemClock
from gateway.config.latency_settings import LatencyModelSettings
from gateway.upstream.tpot_limit import TpotConcurrencyLimit
from router.latency_model import LatencyEstimate, ReplicaLatencyModel
from router.load import fresh_sample
from router.types import EngineLoad

AFFINITY_SHARE_WEIGHT = 0.02


@dataclass(frozen=True, slots=True)
class DispatchSample:
    """What a request found on the replica when it was dispatched there."""

    uncached_tokens: int
    queued_prefill_tokens: int
    running: float
    waiting: float
    since_last_token_s: float = 0.0


OWN_SHARE_WEIGHT = 0.1
"""Weight of one scrape in `ReplicaCost.own_share` (about the last ten scrapes, 5 s at the default
interval: the mix of senders changes with their loads, not scrape by scrape)."""


class ReplicaCost:
    """One replica's token-aware load, latency model and learned cap (module docstring)."""

    __slots__ = (
        "_cap_max_affinity_share",
        "_clock",
        "_tpot_limit",
        "affinity_share",
        "decoding_requests",
        "foreign_requests",
        "last_token_s",
        "learned_cap",
        "model",
        "own_share",
        "prefill_tokens_inflight",
        "token_latency_s",
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
        self.foreign_requests = 0.0
        """Requests on the engine that this instance did not send (other gateway instances, direct
        clients): engine running + waiting minus this instance's in-flight, at the last fresh scrape."""
        self.own_share = 1.0
        """This instance's share of the engine's batch, smoothed over scrapes (module docstring)."""
        self.token_latency_s: float | None = None
        """The engine's mean inter-token latency over the last closed scrape window (None: unknown)."""
        self.affinity_share: float | None = None
        self._cap_max_affinity_share = settings.cap_max_affinity_share
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
                    paced=settings.cap_paced_by_generation,
                )

    @property
    def windowed(self) -> bool:
        """The learned cap follows the engine's token latency (fast samples), on its whole batch."""
        return self._tpot_limit is not None and self._tpot_limit.windowed

    @property
    def cap_set_point_s(self) -> float | None:
        """The token latency the learned cap steers the engine to (the trimmed set point, or the
        reachable one after futile cuts: `gateway.upstream.cut_check`); None without fast samples."""
        limit = self._tpot_limit
        return limit.steered_set_point_s if limit is not None and limit.windowed else None

    @property
    def cap_has_room(self) -> bool:
        """The engine's token latency over its last window under the set point its learned cap steers
        to: a cap that binds now lags the batch (it grows a step a window) rather than holds the
        objective; False without fast samples (`gateway.proxy.ring_owner_claim`)."""
        set_point, latency = self.cap_set_point_s, self.token_latency_s
        return set_point is not None and latency is not None and latency < set_point

    @property
    def cap_held_near_floor(self) -> bool:
        """The learned cap held within twice `min_cap_per_replica` with the token latency over its set
        point (`TpotConcurrencyLimit.held_near_floor`); False without fast samples."""
        limit = self._tpot_limit
        return limit is not None and limit.windowed and limit.held_near_floor

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
        affinity_tokens: int | None = None,
    ) -> DispatchSample:
        """A request with `uncached_tokens` to prefill is sent here, where `inflight` requests already
        run: count it, return what it found (requests ahead without a first token: `inflight` minus the
        decoding ones, or the engine's fresh `waiting` when larger). With `prompt_tokens` and
        `affinity_tokens` (of them, those some replicas hold and others do not) known, the affinity
        share moves."""
        if prompt_tokens is not None and prompt_tokens > 0 and affinity_tokens is not None:
            share = min(max(affinity_tokens, 0), prompt_tokens) / prompt_tokens
            last = self.affinity_share
            self.affinity_share = share if last is None else last + AFFINITY_SHARE_WEIGHT * (share - last)
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

    def engine_sampled(self, token_latency_s: float | None, engine_batch: float, own_inflight: int) -> None:
        """A fresh scrape: the engine runs and queues `engine_batch` requests, `own_inflight` of them this
        instance's; `token_latency_s` (when the scrape closed a window) moves the learned cap on the
        engine's whole batch (`TpotConcurrencyLimit.observe_window`)."""
        self.foreign_requests = max(0.0, engine_batch - own_inflight)
        if own_inflight > 0 or engine_batch > 0:
            share = own_inflight / max(float(own_inflight), engine_batch)
            self.own_share += OWN_SHARE_WEIGHT * (share - self.own_share)
        if token_latency_s is not None:
            self.token_latency_s = token_latency_s
        limit = self._tpot_limit
        if limit is None or token_latency_s is None:
            return
        if self._gated():
            limit.reset()  # prefix affinity at work: a cap would spill requests to cold replicas
        else:
            limit.observe_window(token_latency_s, engine_batch)
        self.learned_cap = limit.cap

    def _gated(self) -> bool:
        """The affinity gate (`cap_max_affinity_share`, off by default) holds the cap off here."""
        gate, share = self._cap_max_affinity_share, self.affinity_share
        return gate is not None and share is not None and share >= gate

    def engine_lost(self) -> None:
        """No fresh scrape any more: nothing is known of other senders."""
        self.foreign_requests = 0.0
        self.own_share = 1.0

    def learn_tpot(self, running: float, engine: EngineLoad | None, tpot_s: float, inflight: int = 0) -> None:
        """Learn one TPOT sample (with `inflight` requests on the replica now) and move the cap."""
        if self.model is None:
            return
        kv_usage = fresh_sample(engine).kv_usage_ratio
        self.model.observe_tpot(running, kv_usage, tpot_s)
        limit = self._tpot_limit
        if limit is None:
            return
        if self._gated():
            limit.reset()  # prefix affinity at work: a cap would spill requests to cold replicas
        else:
            limit.observe(tpot_s, inflight, self.own_share)
        self.learned_cap = limit.cap
