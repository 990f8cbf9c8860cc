"""Desired replicas from one window of measurements, with the planner's barrier model.

    N_thr    = λ·ō / T_dec                                       throughput barrier (replicas at 100 %)
    L        = λ·W (Little's law), or the engines' summed batch L_engine when larger and no queue
    N_lat    = L / B_max                                         latency barrier
    queue pressure  ⇔  standing queue (min depth over the recent window ≥ threshold)
                       or recent p95 admission wait ≥ threshold
    N_queue  = max(λ'·ō / T_dec, λ'·W / B_max), λ' = max(λ, λ_recent)      only under queue pressure
    floor_q  = ready + 1 under queue pressure unless the queue is draining (depth trend < 0)
    floor_slo= ready + 1 when TTFT p95 (net of queue wait) or TPOT p95 exceeds the SLO
    D        = max(N_thr, N_lat, N_queue)                        the load, in replicas at 100 %
    up       = clamp(max(⌈N_thr/ρ_up⌉, ⌈N_lat/ρ_up⌉, ⌈max(N_queue/ρ_up, floor_q)⌉, floor_slo, min))
    down     = clamp(max(up, ⌈D / ρ_down⌉))

The functions are the planner's (`capacity.barriers`): fed the design's worked example (λ = 20,
ō = 300, W = 4.50 s, B_max = 64, T_dec = 4,352) they give N_thr = 1.38 and N_lat = 1.41 as the plan
does, so up = ⌈1.41 / 0.8⌉ = 2 = the plan's N_base; at 3× (60 req/s) up = ⌈4.22 / 0.8⌉ = 6, the
plan's spike answer at ρ = 0.8.

Why the leads: λ averaged over a minute trails a step by most of that minute, and completions (ō, W)
trail it by W; a queue or full batches are visible within seconds. Under queue pressure the engines'
batches are capped by the gateway (they say "full", not "how much is wanted"), so L_engine is used
only when there is no queue; the queue view takes over, driven by the arrival rate itself. A backlog
is not turned into extra replicas: per the planner, the spare capacity at ρ_up drains it. The floors
count *ready* replicas, so they do not run away while new replicas are still cold-starting.
GPU utilisation is deliberately not an input: a GPU is "100 % busy" at batch 1 and at batch 256.
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity.autoscale_settings import AutoscaleSettings, PoolCapacity, ScaleReason
from capacity.autoscale_window import WindowStats
from capacity.barriers import ceil_count, latency_gpus, littles_law_requests, throughput_gpus

_PRIORITY = {
    ScaleReason.QUEUE: 5,
    ScaleReason.SLO_TTFT: 4,
    ScaleReason.SLO_TPOT: 3,
    ScaleReason.LATENCY: 2,
    ScaleReason.THROUGHPUT: 1,
    ScaleReason.MINIMUM: 0,
}
"""Tie-break between candidates with the same target and the same unrounded demand: leads first."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """One evaluation's answer and every input that drove it.

    `arrival_rate_per_s` is the pool's λ (the window's, divided by `traffic_share_ratio`; λ_recent is
    divided by `recent_traffic_share_ratio`);
    `*_replicas` floats are barriers in replicas at 100 % utilisation (before ρ and rounding);
    `scale_up_replicas` / `scale_down_replicas` are the hysteresis targets the controller uses;
    `reason` names the candidate that set `scale_up_replicas`.
    """

    stats: WindowStats
    traffic_share_ratio: float
    recent_traffic_share_ratio: float
    arrival_rate_per_s: float
    little_concurrency_requests: float
    concurrency_requests: float
    occupancy_ratio: float
    throughput_replicas: float
    latency_replicas: float
    queue_replicas: float
    queue_pressure: bool
    queue_draining: bool
    queue_floor_replicas: int
    slo_ttft_breached: bool
    slo_tpot_breached: bool
    load_replicas: float
    scale_up_replicas: int
    scale_down_replicas: int
    reason: ScaleReason


def queue_pressure(stats: WindowStats, settings: AutoscaleSettings) -> bool:
    """A standing queue (never empty over the recent window) or recent p95 waits above the threshold."""
    standing = stats.queue_depth_standing >= settings.queue_depth_threshold
    waits = stats.queue_wait_p95_s is not None and stats.queue_wait_p95_s >= settings.queue_wait_threshold_s
    return standing or waits


def slo_breached(p95_s: float | None, samples: int, slo_s: float | None, min_samples: int) -> bool:
    """p95 above the objective, with enough samples to mean it."""
    return slo_s is not None and p95_s is not None and samples >= min_samples and p95_s > slo_s


def estimate_replicas(
    stats: WindowStats,
    capacity: PoolCapacity,
    settings: AutoscaleSettings,
    traffic_share_ratio: float = 1.0,
    recent_traffic_share_ratio: float | None = None,
) -> Estimate:
    """The barrier model on measured inputs; see the module docstring for the formulas.

    `traffic_share_ratio` is the fraction of the pool's arrivals this gateway instance sees (1 with
    one instance, ≈ 1/k with k instances behind a load balancer): λ is divided by it to get the pool's
    rate, and λ_recent by `recent_traffic_share_ratio` (default: the same share). They differ only
    while the share changes: `PoolAutoscaler` passes each window's time-averaged share. The engines'
    batches are pool-wide already (every instance scrapes every replica), and the queue is treated
    as representative of every instance's.
    """
    recent_share = traffic_share_ratio if recent_traffic_share_ratio is None else recent_traffic_share_ratio
    if not (0 < traffic_share_ratio <= 1 and 0 < recent_share <= 1):
        raise ValueError("traffic_share_ratio and recent_traffic_share_ratio must be in (0, 1]")
    rho_up, rho_down = settings.scale_up_utilisation_ratio, settings.scale_down_utilisation_ratio
    t_dec, b_max = capacity.decode_tokens_per_s, capacity.b_max
    lam = stats.arrival_rate_per_s / traffic_share_ratio
    mean_out = stats.mean_output_tokens or 0.0
    w_s = stats.time_in_system_s or 0.0
    pressure = queue_pressure(stats, settings)
    little = littles_law_requests(lam, w_s)
    concurrency = little if pressure else max(little, stats.engine_running_requests)
    n_thr = throughput_gpus(lam, mean_out, t_dec)
    n_lat = latency_gpus(concurrency, b_max)
    n_queue, floor_q = 0.0, 0
    draining = pressure and stats.queue_trend_per_s < 0
    if pressure:
        lead = max(lam, stats.recent_arrival_rate_per_s / recent_share)
        n_queue = max(
            throughput_gpus(lead, mean_out, t_dec),
            latency_gpus(littles_law_requests(lead, w_s), b_max),
        )
        floor_q = 0 if draining else stats.ready_replicas + 1
    ttft_bad = slo_breached(
        stats.ttft_p95_s, stats.ttft_samples, capacity.ttft_p95_slo_s, settings.min_latency_samples
    )
    tpot_bad = slo_breached(
        stats.tpot_p95_s, stats.tpot_samples, capacity.tpot_p95_slo_s, settings.min_latency_samples
    )
    candidates = [
        _candidate(n_thr / rho_up, ScaleReason.THROUGHPUT),
        _candidate(n_lat / rho_up, ScaleReason.LATENCY),
        _candidate(float(settings.min_replicas), ScaleReason.MINIMUM),
    ]
    if pressure:
        candidates.append(_candidate(max(n_queue / rho_up, float(floor_q)), ScaleReason.QUEUE))
    if ttft_bad:
        candidates.append(_candidate(float(stats.ready_replicas + 1), ScaleReason.SLO_TTFT))
    if tpot_bad:
        candidates.append(_candidate(float(stats.ready_replicas + 1), ScaleReason.SLO_TPOT))
    wanted, _, _, reason = max(candidates)
    if wanted == 0:  # nothing at all to serve and min_replicas = 0
        reason = ScaleReason.MINIMUM
    up = settings.clamp(wanted)
    if up < wanted:
        reason = ScaleReason.MAXIMUM
    load = max(n_thr, n_lat, n_queue)
    ready = stats.ready_replicas
    return Estimate(
        stats=stats,
        traffic_share_ratio=traffic_share_ratio,
        recent_traffic_share_ratio=recent_share,
        arrival_rate_per_s=lam,
        little_concurrency_requests=little,
        concurrency_requests=concurrency,
        occupancy_ratio=stats.engine_running_requests / (ready * b_max) if ready else 0.0,
        throughput_replicas=n_thr,
        latency_replicas=n_lat,
        queue_replicas=n_queue,
        queue_pressure=pressure,
        queue_draining=draining,
        queue_floor_replicas=floor_q,
        slo_ttft_breached=ttft_bad,
        slo_tpot_breached=tpot_bad,
        load_replicas=load,
        scale_up_replicas=up,
        scale_down_replicas=settings.clamp(max(up, ceil_count(load / rho_down))),
        reason=reason,
    )


def _candidate(units: float, reason: ScaleReason) -> tuple[int, float, int, ScaleReason]:
    """(replicas, unrounded demand, tie-break priority, reason): `max` picks the binding one."""
    return ceil_count(units), units, _PRIORITY[reason], reason
