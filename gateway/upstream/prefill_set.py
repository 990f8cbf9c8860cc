"""A disaggregated pool's prefill set, registered as a pool of its own (`ReplicaRegistry`)."""

from __future__ import annotations

from gateway.config.pool_settings import PoolSettings


def prefill_set_settings(settings: PoolSettings) -> PoolSettings:
    """A disaggregated pool's prefill set as a pool of its own, registered as `<model>/prefill`: the
    pool's settings with the prefill set's replicas, cap and policy; its engines are asked for the
    pool's upstream model; the pool's autoscaling signal, if any, with the set's own batch cap (its
    `max_concurrency_per_replica`, else `autoscale.b_max`, else the decode set's cap)."""
    disagg = settings.disaggregation
    assert disagg is not None
    autoscale = settings.autoscale
    if autoscale is not None:
        b_max = disagg.prefill.max_concurrency_per_replica or autoscale.b_max
        b_max = b_max or settings.max_concurrency_per_replica
        autoscale = autoscale.model_copy(update={"b_max": b_max})
    return settings.model_copy(
        update={
            "model": f"{settings.model}/prefill",
            "upstream_model": settings.upstream_model or settings.model,
            "replicas": disagg.prefill.replicas,
            "policy": disagg.prefill_policy,
            "max_concurrency_per_replica": disagg.prefill.max_concurrency_per_replica,
            "autoscale": autoscale,
        }
    )
