"""A disaggregated pool's prefill set, registered as a pool of its own (`ReplicaRegistry`)."""

from __future__ import annotations

from gateway.pool_settings import PoolSettings


def prefill_set_settings(settings: PoolSettings) -> PoolSettings:
    """A disaggregated pool's prefill set as a pool of its own, registered as `<model>/prefill`: the
    pool's settings with the prefill set's replicas, cap and policy; its engines are asked for the
    pool's upstream model; no autoscaling signal."""
    disagg = settings.disaggregation
    assert disagg is not None
    return settings.model_copy(
        update={
            "model": f"{settings.model}/prefill",
            "upstream_model": settings.upstream_model or settings.model,
            "replicas": disagg.prefill.replicas,
            "policy": disagg.prefill_policy,
            "max_concurrency_per_replica": disagg.prefill.max_concurrency_per_replica,
            "autoscale": None,
        }
    )
