"""Hysteresis between estimates and the exported replica count: fast up, slow and lower down.

    up-target   u = ⌈D / ρ_up⌉   (with the queue/SLO floors, clamped)      ρ_up   = 0.8
    down-target d = ⌈D / ρ_down⌉ (never below u, clamped)                  ρ_down = 0.6

    u > N                       → N := u at once (scale-up reacts within one evaluation period)
    d < N for ≥ cooldown         → N := d (or N − step with `scale_down_step_replicas`); the timer restarts
    otherwise                   → hold; the low timer resets whenever d ≥ N

`d < N` means even one replica fewer would run at or below ρ_down, so after a step down the pool sits
at utilisation ≤ ρ_down and going back up needs the load to grow by ρ_up / ρ_down = 1.33×: noise of
±10 % cannot flap it. The band is history-dependent by design: with the worked example's load
(D = 1.41) both 2 replicas (ρ = 0.70) and 3 (ρ = 0.47) are stable — a pool that scaled up for a spike
settles at 3 afterwards (the plan's N with r = 0.5), one that grew to this load stays at 2.
No scale-down during the first window after start (the window is still filling): a restarted
gateway keeps `initial_replicas` (pass the replicas that currently exist) until it has seen a full
window and a full cooldown of low load.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from capacity.autoscale_estimate import Estimate
from capacity.autoscale_settings import AutoscaleSettings, ScaleReason


class ScaleAction(StrEnum):
    """What this evaluation did to the desired count."""

    UP = "up"
    DOWN = "down"
    HOLD = "hold"


@dataclass(frozen=True, slots=True)
class ControllerStep:
    """The desired count after one evaluation, what changed, why, and how long a scale-down has waited."""

    replicas: int
    previous_replicas: int
    action: ScaleAction
    reason: ScaleReason
    scale_down_pending_s: float


class HysteresisController:
    """Keeps the desired replica count; `step(estimate, now_s)` applies the rules above."""

    def __init__(self, settings: AutoscaleSettings, initial_replicas: int, started_at_s: float) -> None:
        self._settings = settings
        self._replicas = settings.clamp(initial_replicas)
        self._started_at_s = started_at_s
        self._low_since_s: float | None = None

    @property
    def replicas(self) -> int:
        """The current desired count."""
        return self._replicas

    def step(self, estimate: Estimate, now_s: float) -> ControllerStep:
        """One evaluation: scale up at once, down after the cooldown, otherwise hold."""
        s, current = self._settings, self._replicas
        up, down = estimate.scale_up_replicas, estimate.scale_down_replicas
        if up > current:
            return self._move(up, ScaleAction.UP, estimate.reason)
        warm = now_s - self._started_at_s >= s.window_s
        if down >= current or not warm:
            self._low_since_s = None
            return ControllerStep(current, current, ScaleAction.HOLD, estimate.reason, 0.0)
        if self._low_since_s is None:
            self._low_since_s = now_s
        pending = now_s - self._low_since_s
        if pending < s.scale_down_cooldown_s:
            return ControllerStep(current, current, ScaleAction.HOLD, ScaleReason.COOLDOWN, pending)
        step = s.scale_down_step_replicas
        target = down if step is None else max(down, current - step)
        return self._move(target, ScaleAction.DOWN, estimate.reason)

    def _move(self, target: int, action: ScaleAction, reason: ScaleReason) -> ControllerStep:
        previous, self._replicas, self._low_since_s = self._replicas, target, None
        return ControllerStep(target, previous, action, reason, 0.0)
