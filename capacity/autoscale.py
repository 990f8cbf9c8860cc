"""Live autoscaling signal: desired replicas per pool from what the gateway measures (issue 8, live half).

The gateway feeds one `PoolAutoscaler` per pool with small synchronous calls and exports the result:

    observe_arrival()                                   admission, for every request of the pool
    observe_queue_wait(wait_s)                          admission, when a request leaves the queue
    observe_queue_depth(depth)                          every scrape tick (periodic sample)
    observe_engine_running(replica, running)            engine scraper, per replica per scrape
    forget_replica(replica)                             registry, when a replica leaves / goes down
    set_traffic_share(ratio)                            k gateway instances (instance_membership): 1/k
    observe_completion(tokens, e2e_s, ttft_s=, tpot_s=, queue_wait_s=)   proxy, per finished request
    poll() / evaluate()                                 every evaluation period → AutoscaleDecision

`AutoscaleDecision.gauges()` lists the Prometheus samples to set, led by
`llm_gateway_desired_replicas{pool}` which KEDA or an HPA scale the engine Deployment on
(`deploy/kubernetes/autoscaling/`). The pieces: `autoscale_window` (sliding windows),
`autoscale_estimate` (the planner's barriers on measured inputs), `autoscale_controller`
(hysteresis), `autoscale_settings` (capacity model, settings, reason labels). Pure and synchronous:
time comes from an injected clock, nothing here does I/O or awaits.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from capacity.autoscale_controller import ControllerStep, HysteresisController, ScaleAction
from capacity.autoscale_estimate import Estimate, estimate_replicas
from capacity.autoscale_settings import AutoscaleSettings, PoolCapacity, ScaleReason
from capacity.autoscale_window import AutoscaleWindow, Clock, WindowStats

__all__ = [
    "METRIC_DESIRED_REPLICAS",
    "AutoscaleDecision",
    "AutoscaleSettings",
    "AutoscaleWindow",
    "Clock",
    "Estimate",
    "GaugeSample",
    "PoolAutoscaler",
    "PoolCapacity",
    "ScaleAction",
    "ScaleReason",
    "WindowStats",
]

METRIC_DESIRED_REPLICAS = "llm_gateway_desired_replicas"
_P = "llm_gateway_autoscale_"


class GaugeSample(NamedTuple):
    """One gauge value to export: full metric name, labels, value (NaN = nothing measured)."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class AutoscaleDecision:
    """One evaluation of one pool: the desired count, what happened, why, and the inputs."""

    pool: str
    evaluated_at_s: float
    desired_replicas: int
    previous_replicas: int
    action: ScaleAction
    reason: ScaleReason
    scale_down_pending_s: float
    traffic_share_ratio: float
    """The share in effect at the evaluation (1/k); λ is divided by its averages over the windows."""
    estimate: Estimate

    def gauges(self) -> list[GaugeSample]:
        """Every sample to export for this pool (see docs/CAPACITY.md, "Live autoscaling signal").

        `reason` is a separate 0/1 gauge over all labels, not a label of desired_replicas: a changing
        label would leave the old series behind and `max(desired_replicas)` would read both.
        """
        e, st = self.estimate, self.estimate.stats
        pool = {"pool": self.pool}
        nan = math.nan

        def opt(value: float | None) -> float:
            return nan if value is None else value

        samples = [
            GaugeSample(METRIC_DESIRED_REPLICAS, pool, float(self.desired_replicas)),
            GaugeSample(_P + "ready_replicas", pool, float(st.ready_replicas)),
            GaugeSample(_P + "arrival_rate_per_second", pool, e.arrival_rate_per_s),
            GaugeSample(
                _P + "recent_arrival_rate_per_second",
                pool,
                st.recent_arrival_rate_per_s / e.recent_traffic_share_ratio,
            ),
            GaugeSample(_P + "traffic_share_ratio", pool, self.traffic_share_ratio),
            GaugeSample(_P + "mean_output_tokens", pool, opt(st.mean_output_tokens)),
            GaugeSample(_P + "time_in_system_seconds", pool, opt(st.time_in_system_s)),
            GaugeSample(_P + "concurrency_requests", pool, e.concurrency_requests),
            GaugeSample(_P + "batch_occupancy_ratio", pool, e.occupancy_ratio),
            GaugeSample(_P + "queue_depth_standing", pool, st.queue_depth_standing),
            GaugeSample(_P + "queue_wait_p95_seconds", pool, opt(st.queue_wait_p95_s)),
            GaugeSample(_P + "ttft_p95_seconds", pool, opt(st.ttft_p95_s)),
            GaugeSample(_P + "tpot_p95_seconds", pool, opt(st.tpot_p95_s)),
            GaugeSample(_P + "scale_up_replicas", pool, float(e.scale_up_replicas)),
            GaugeSample(_P + "scale_down_replicas", pool, float(e.scale_down_replicas)),
            GaugeSample(_P + "scale_down_pending_seconds", pool, self.scale_down_pending_s),
        ]
        for barrier, value in (
            ("throughput", e.throughput_replicas),
            ("latency", e.latency_replicas),
            ("queue", e.queue_replicas),
        ):
            samples.append(GaugeSample(_P + "barrier_replicas", {**pool, "barrier": barrier}, value))
        for reason in ScaleReason:
            hit = 1.0 if reason is self.reason else 0.0
            samples.append(GaugeSample(_P + "reason", {**pool, "reason": reason.value}, hit))
        return samples


class PoolAutoscaler:
    """Window + estimator + hysteresis for one pool.

    `initial_replicas` is the count to start from (default `settings.min_replicas`); pass the number
    of replicas that exist when the gateway starts, so a restart does not export a lower count.
    """

    def __init__(
        self,
        pool: str,
        capacity: PoolCapacity,
        clock: Clock,
        settings: AutoscaleSettings | None = None,
        initial_replicas: int | None = None,
    ) -> None:
        self.pool = pool
        self.capacity = capacity
        self.settings = settings if settings is not None else AutoscaleSettings()
        s = self.settings
        self._clock = clock
        self.window = AutoscaleWindow(
            clock,
            window_s=s.window_s,
            recent_s=s.evaluation_period_s,
            replica_stale_s=s.replica_stale_s,
            bucket_s=s.bucket_s,
            max_samples=s.max_samples,
        )
        start = s.min_replicas if initial_replicas is None else initial_replicas
        self._controller = HysteresisController(s, start, self.window.started_s)
        self._last: AutoscaleDecision | None = None
        self._shares: deque[tuple[float, float]] = deque([(self.window.started_s, 1.0)])
        """(since_s, share): the traffic share's history over the window, oldest first."""

    # --- observations (delegated to the window; see AutoscaleWindow for the semantics) ---

    def observe_arrival(self, count: int = 1) -> None:
        """Requests arrived for this pool (at admission, whether later queued, served or shed)."""
        self.window.observe_arrival(count)

    def observe_completion(
        self,
        output_tokens: int,
        e2e_s: float,
        *,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        queue_wait_s: float = 0.0,
    ) -> None:
        """A request of this pool finished successfully (tokens, e2e, TTFT, TPOT, its queue wait)."""
        self.window.observe_completion(
            output_tokens, e2e_s, ttft_s=ttft_s, tpot_s=tpot_s, queue_wait_s=queue_wait_s
        )

    def observe_engine_running(self, replica: str, running: float) -> None:
        """The engine on `replica` runs `running` sequences (scraper, e.g. vllm:num_requests_running)."""
        self.window.observe_engine_running(replica, running)

    def forget_replica(self, replica: str) -> None:
        """`replica` left the pool or is down."""
        self.window.forget_replica(replica)

    def observe_queue_depth(self, depth: int) -> None:
        """Requests of this pool waiting in admission (sample it periodically)."""
        self.window.observe_queue_depth(depth)

    def observe_queue_wait(self, wait_s: float) -> None:
        """A request of this pool left the admission queue after `wait_s`."""
        self.window.observe_queue_wait(wait_s)

    def set_traffic_share(self, ratio: float) -> None:
        """The fraction of the pool's arrivals this gateway instance sees from now on (default 1: one
        instance).

        With k instances behind a load balancer set 1/k (`gateway.fleet.instance_membership` does, from the
        gateway's
        own membership), so that every instance estimates for the whole pool and
        `max(llm_gateway_desired_replicas)` is right. λ and λ_recent are divided by the share averaged
        over their window (time-weighted), not by the latest one: the arrivals in a window were seen at
        the shares of their time, so a change of k (an instance joins or leaves, e.g. in a rolling
        update) does not read as a step in the pool's load. With 1/k applied at once, a second instance
        joining would double λ for most of a window and scale the engines up for a cooldown.
        """
        if not 0 < ratio <= 1:
            raise ValueError("ratio must be in (0, 1]")
        if ratio == self._shares[-1][1]:
            return
        now = self._clock.now_s()
        if now <= self._shares[-1][0]:
            self._shares[-1] = (self._shares[-1][0], ratio)
        else:
            self._shares.append((now, ratio))

    @property
    def traffic_share_ratio(self) -> float:
        """The share in effect now (the latest `set_traffic_share`)."""
        return self._shares[-1][1]

    def mean_traffic_share(self, span_s: float) -> float:
        """The time-weighted mean share over the last `span_s` seconds (the current one for span 0)."""
        now = self._clock.now_s()
        if span_s <= 0:
            return self.traffic_share_ratio
        start = now - span_s
        weighted = 0.0
        shares = list(self._shares)
        for i, (since_s, share) in enumerate(shares):
            lo = start if i == 0 else max(since_s, start)  # the oldest share also covers what precedes it
            hi = shares[i + 1][0] if i + 1 < len(shares) else now
            if hi > lo:
                weighted += share * (hi - lo)
        return weighted / span_s

    def _forget_old_shares(self, now_s: float) -> None:
        """Drop the shares that ended before the window began (the one in effect then stays)."""
        horizon = now_s - self.settings.window_s
        while len(self._shares) > 1 and self._shares[1][0] <= horizon:
            self._shares.popleft()

    # --- evaluation ---

    @property
    def desired_replicas(self) -> int:
        """The current desired count (the initial count before the first evaluation)."""
        return self._controller.replicas

    def evaluate(self) -> AutoscaleDecision:
        """Evaluate now: window stats → estimate → hysteresis step."""
        stats = self.window.stats()
        self._forget_old_shares(stats.now_s)
        estimate = estimate_replicas(
            stats,
            self.capacity,
            self.settings,
            self.mean_traffic_share(stats.window_span_s),
            self.mean_traffic_share(stats.recent_span_s),
        )
        step: ControllerStep = self._controller.step(estimate, stats.now_s)
        self._last = AutoscaleDecision(
            pool=self.pool,
            evaluated_at_s=stats.now_s,
            desired_replicas=step.replicas,
            previous_replicas=step.previous_replicas,
            action=step.action,
            reason=step.reason,
            scale_down_pending_s=step.scale_down_pending_s,
            traffic_share_ratio=self.traffic_share_ratio,
            estimate=estimate,
        )
        return self._last

    def poll(self) -> AutoscaleDecision | None:
        """Evaluate if an evaluation period has passed since the last one (or since start), else return
        the last decision; call it from any periodic loop (None until the first period has passed)."""
        now = self._clock.now_s()
        since = self._last.evaluated_at_s if self._last is not None else self.window.started_s
        if now - since >= self.settings.evaluation_period_s:
            return self.evaluate()
        return self._last
