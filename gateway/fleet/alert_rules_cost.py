"""Cost per goodput token, live, as recording rules (DESIGN §7: cost per token = GPU-hour price ÷
(goodput tok/s × 3600)). Emitted for each pool with `cost` set, labelled `model="<pool>"`, over w = 5m:

  llm_gateway:pool_replicas:max
      = max(sum without (state) (llm_gateway_replicas{pool}))
      every replica the pool knows, whatever its state (a down or draining pod still holds its GPUs);
      the max over gateway instances, which each export the same count (a sum would count it k times)
  llm_gateway:gpu_cost_usd_per_second = pool_replicas × gpus_per_replica × gpu_usd_per_hour / 3600
  llm_gateway:goodput_tokens:rate5m   = Σ rate(llm_gateway_goodput_tokens_total[5m])
  llm_gateway:cost_usd_per_million_goodput_tokens:rate5m
      = gpu_cost_usd_per_second / goodput_tokens:rate5m × 1e6
      (+Inf while the pool serves no goodput: its GPUs still cost)
  llm_gateway:cost_usd_per_million_tokens_at_b_max   (only with `autoscale` set)
      = capacity.cost.usd_per_million_tokens(gpus_per_replica × gpu_usd_per_hour,
                                             autoscale.decode_tokens_per_s)
      the planner's figure: a replica decoding at its measured aggregate rate at B_max, fully used —
      the floor the live figure approaches when every replica runs at B_max and every token is goodput.

and once for the fleet (when any pool has a cost):

  llm_gateway:tenant_cost_usd_per_second:rate5m{tenant}
      = Σ gpu_cost_usd_per_second × Σ rate(llm_gateway_tenant_tokens_total{tenant}[5m])
                                  / Σ rate(llm_gateway_tokens_total[5m])
      each tenant's share of all tokens (input and output, as the engines report them) times the cost of
      the priced pools. The tenant counter carries no pool label (tenants × pools would multiply the
      series), so the share is taken over the whole gateway: exact with one priced pool, a blend with
      several. Tenants are the configured ones (a bounded label, DESIGN §4).
"""

from __future__ import annotations

from collections.abc import Sequence

from capacity.cost import usd_per_million_tokens
from gateway.config.settings import PoolSettings
from gateway.fleet.alert_rules_promql import Rule, duration, number, selector

GPU_COST_RECORD = "llm_gateway:gpu_cost_usd_per_second"


def pool_cost_rules(pool: PoolSettings, extra: str, window_s: int) -> list[Rule]:
    """The cost rules of one pool (module docstring); none without `pool.cost`."""
    cost = pool.cost
    if cost is None:
        return []
    w, model = duration(window_s), pool.model
    own = f'{{model="{model}"}}'
    replicas = "llm_gateway:pool_replicas:max"
    goodput = f"llm_gateway:goodput_tokens:rate{w}"
    rules: list[Rule] = [
        {
            "record": replicas,
            "expr": f"max(sum without (state) (llm_gateway_replicas{selector(extra, pool=model)}))",
        },
        {
            "record": GPU_COST_RECORD,
            "expr": f"{replicas}{own} * {cost.gpus_per_replica} * {number(cost.gpu_usd_per_hour)} / 3600",
        },
        {
            "record": goodput,
            "expr": f"sum(rate(llm_gateway_goodput_tokens_total{selector(extra, model=model)}[{w}]))",
        },
        {
            "record": f"llm_gateway:cost_usd_per_million_goodput_tokens:rate{w}",
            "expr": f"{GPU_COST_RECORD}{own} / {goodput}{own} * 1e6",
        },
    ]
    if pool.autoscale is not None:
        at_b_max = usd_per_million_tokens(
            cost.gpus_per_replica * cost.gpu_usd_per_hour, pool.autoscale.decode_tokens_per_s
        )
        rules.append({"record": "llm_gateway:cost_usd_per_million_tokens_at_b_max", "expr": number(at_b_max)})
    for rule in rules:
        rule["labels"] = {"model": model}
    return rules


def tenant_cost_rules(pools: Sequence[PoolSettings], extra: str, window_s: int) -> list[Rule]:
    """The per-tenant attribution (module docstring); none when no pool has a cost."""
    if all(pool.cost is None for pool in pools):
        return []
    w, sel = duration(window_s), selector(extra)
    return [
        {
            "record": f"llm_gateway:tenant_cost_usd_per_second:rate{w}",
            "expr": (
                f"scalar(sum({GPU_COST_RECORD}))"
                f" * sum by (tenant) (rate(llm_gateway_tenant_tokens_total{sel}[{w}]))"
                f" / scalar(sum(rate(llm_gateway_tokens_total{sel}[{w}])))"
            ),
        }
    ]
