"""The alert for an objective the fleet cannot reach at any batch: the learned cap held at its floor.

Emitted once for the fleet when any pool learns a cap (`latency_model.enabled` and `adaptive_cap`, with
`slo.tpot_s` set):

  LLMGatewayLearnedCapHeldAtFloor{replica}
      max by (replica) (min_over_time(llm_gateway_learned_cap_held_at_floor[2m])) == 1   for 15m

(the 2-minute minimum: a probe or a scrape between two rule evaluations that let it go resets the 15).

`llm_gateway_learned_cap_held_at_floor` is 1 while a replica's learned cap is within twice
`min_cap_per_replica` (its probes included) and the engine's token latency is still over the set point
the cap steers to (`gateway.upstream.tpot_limit`). Where a smaller batch lowers the latency but never
under the set point, the cap holds its floor and the replica serves a handful of requests while the
rest are refused: an objective set tighter than the engine delivers (`slo.tpot_s`, usually a
mis-set one), a slow model, or a sick engine. A real overload does not hold a cap there for long: the
cap finds the batch whose latency meets the set point, far above the floor on any GPU engine. So
fifteen minutes of it, in any gateway instance, is worth a ticket, not a page: the pool still answers
(429 with Retry-After), but at a fraction of what its replicas could serve. Where the latency does not
fall with the batch at all, the cap's own check lifts it (`gateway.upstream.cut_check`), and this
alert stays quiet.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.config.settings import PoolSettings
from gateway.fleet.alert_rules_promql import Rule, duration, selector

HELD_WINDOW_S = 900
"""How long the cap must stay held (the alert's `for`)."""
STEADY_WINDOW_S = 120
"""Every sample in this window must say held for the condition to hold at an evaluation."""
ALERT_NAME = "LLMGatewayLearnedCapHeldAtFloor"


def learned_cap_rules(pools: Sequence[PoolSettings], extra: str) -> list[Rule]:
    """The fleet's learned-cap alert (module docstring); none when no pool learns a cap."""
    if not any(p.learns_cap for p in pools):
        return []
    w, steady = duration(HELD_WINDOW_S), duration(STEADY_WINDOW_S)
    series = f"llm_gateway_learned_cap_held_at_floor{selector(extra)}"
    return [
        {
            "alert": ALERT_NAME,
            "expr": f"max by (replica) (min_over_time({series}[{steady}])) == 1",
            "for": w,
            "labels": {"severity": "ticket"},
            "annotations": {
                "summary": "{{ $labels.replica }}: learned cap held at its floor for " + w,
                "description": (
                    f"For {w} the learned cap of replica {{{{ $labels.replica }}}} has stayed within twice "
                    "min_cap_per_replica while the engine's token latency stayed over the set point: the "
                    "TPOT objective is out of reach at the batches it allows, and most of the pool's "
                    "requests are refused. Check slo.tpot_s against what the engine delivers at a small "
                    "batch (llm_gateway_learned_cap_set_point_seconds, the engine's inter-token latency), "
                    "and the engine itself."
                ),
            },
        }
    ]
