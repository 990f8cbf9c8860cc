"""How the gateway names its metrics: every name starts with `PREFIX` (`llm_gateway_…`), and labels
never carry request ids, prompts or session keys (only long-lived values: models, replicas, outcomes,
reasons, policies, tenants).
"""

from typing import Final

PREFIX = "llm_gateway"

# How a gauge's values from several worker processes (`server.workers` > 1, the Prometheus client's
# multiprocess mode: `gateway.base.metrics`) become one series; "live": a dead worker's values drop out.
# Ignored with one worker (the client keeps one value in memory, as without the argument).
WORKERS_SUM: Final = "livesum"
"""Each worker holds its part of a whole: in-flight requests, queue depth, prefill tokens in flight, open
client connections. The sum is the instance's total."""
WORKERS_MAX: Final = "livemax"
"""Each worker observes or learns a shared thing on its own (replica health state, breaker, draining,
panic, replicas by state, what the engine reports, the learned model, discovered models, the autoscaling
signal, which already estimates for the whole pool): the highest worker's value - the worst breaker
state, any worker draining or in panic, the latest engine reading of the busiest scrape."""
WORKERS_MIN: Final = "livemin"
"""A yes/no that holds only if it holds in every worker: `replica_up` (0 when any worker has taken the
replica out), `prefix_index_sharing_up` (0 when any worker routes on its own index alone)."""
