"""Per-pool fallback (`gateway.proxy.fallback`): which refusals pass a request on, in what order, and
what the client gets when every pool refuses."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from core.clock import FakeClock
from gateway.base.errors import GatewayError, NoReplica, QueueFull, QueueTimeout, RateLimited
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.proxy.context import RequestContext
from gateway.proxy.fallback import Fallback
from gateway.proxy.reply import Reply
from gateway.upstream.model_catalog import ModelCatalog, ServedModel
from gateway.upstream.registry import ReplicaRegistry


class _Ctx:
    def __init__(self, served: ServedModel) -> None:
        self.pool = served.pool


def _setup() -> tuple[list[ServedModel], ServedModel, GatewayMetrics]:
    pools = [
        {"model": name, "replicas": {"static": [f"http://10.0.0.{i}:8000"]}, **extra}
        for i, (name, extra) in enumerate([("a", {"fallback": ["b", "c"]}), ("b", {}), ("c", {})], start=1)
    ]
    settings = parse_settings({"pools": pools})
    metrics = GatewayMetrics()
    catalog = ModelCatalog(ReplicaRegistry(settings, metrics, FakeClock(0), random.Random(1)), {})
    first = catalog.resolve("a")
    assert first is not None
    return catalog.fallbacks(first.pool, "chat"), first, metrics


def _run(
    errors: dict[str, GatewayError | None], started: bool = False
) -> tuple[list[str], Any, GatewayMetrics]:
    fallbacks, first, metrics = _setup()
    tried: list[str] = []
    reply = Reply(request_id="r", send=None, clock=FakeClock())  # type: ignore[arg-type]

    async def serve(ctx: Any, reply: Reply) -> None:
        tried.append(ctx.pool.model)
        reply.started = started
        error = errors.get(ctx.pool.model)
        if error is not None:
            raise error

    def context(served: ServedModel) -> RequestContext:
        return _Ctx(served)  # type: ignore[return-value]

    async def main() -> Any:
        return await Fallback(metrics).serve(_Ctx(first), reply, serve, fallbacks, context)  # type: ignore[arg-type]

    try:
        result: Any = asyncio.run(main())
    except GatewayError as error:
        result = error
    return tried, result, metrics


def _count(metrics: GatewayMetrics, refused: str, to: str, reason: str) -> float:
    return float(metrics.fallbacks_total.labels(refused, to, reason)._value.get())


def test_no_replica_and_queue_full_pass_the_request_on_in_order() -> None:
    tried, result, metrics = _run({"a": NoReplica("down"), "b": QueueFull("full")})
    assert tried == ["a", "b", "c"] and result.pool.model == "c"
    assert _count(metrics, "a", "b", "no_replica") == 1
    assert _count(metrics, "b", "c", "queue_full") == 1, "labels: the pool that refused, the one it went to"


def test_when_every_pool_refuses_the_last_refusal_is_the_answer() -> None:
    tried, result, _ = _run({"a": NoReplica("a"), "b": NoReplica("b"), "c": QueueFull("c")})
    assert tried == ["a", "b", "c"]
    assert isinstance(result, QueueFull) and result.message == "c"


@pytest.mark.parametrize("error", [QueueTimeout("waited"), RateLimited("tenant")])
def test_other_refusals_are_the_answer_at_once(error: GatewayError) -> None:
    tried, result, _ = _run({"a": error})
    assert tried == ["a"] and result is error


def test_nothing_falls_back_once_the_response_has_started() -> None:
    tried, result, _ = _run({"a": NoReplica("late")}, started=True)
    assert tried == ["a"] and isinstance(result, NoReplica)
