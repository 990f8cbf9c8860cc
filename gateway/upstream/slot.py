"""A `Slot`: one request's place on one replica, with the routing decision that chose it.

Taking a slot (`ReplicaRegistry.claim`) counts the request on the replica at once — in-flight
requests (those of the lowest priority class apart too: `Replica.lowest_class_inflight`) and estimated
tokens (what routing reads), its uncached prompt tokens in the replica's
prefill load (`gateway.upstream.replica_cost`), the breaker's in-flight count, the `inflight` gauge —
and `release()` undoes exactly that, once (idempotent). `first_token()` moves the request from the
replica's prefill load to its decode batch and teaches the replica's latency model its TTFT;
`finished(output_tokens)` teaches it the TPOT. The admission `Ticket` is the only holder of a slot
(`admission.ticket`): a retry swaps the slot inside the ticket, and the ticket's release releases it
on every path. Release is synchronous and never runs admission in place: the registry tells its
release listeners, and the admission pumps they wake are scheduled (`call_soon`). Its times (dispatch,
first token, end) are the registry's injected clock's (`core.clock`); the gauges it writes are its
replica's `ReplicaGauges`, resolved once per replica, not per slot.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Gauge

from core.clock import Clock
from gateway.base.metrics import GatewayMetrics
from gateway.upstream.replica import Replica
from router.types import Decision


class ReplicaGauges:
    """The metric children one replica's slots write (`inflight`, `prefill_tokens_inflight`, and once
    its latency model has them, `latency_model_error_ratio` and `learned_max_concurrency`), each resolved
    on first use and kept. The registry keeps one per replica and drops it when the replica leaves."""

    __slots__ = ("_errors", "_learned_cap", "_metrics", "_replica_id", "inflight", "prefill_tokens")

    def __init__(self, metrics: GatewayMetrics, replica_id: str) -> None:
        self._metrics = metrics
        self._replica_id = replica_id
        self.inflight = metrics.inflight.labels(replica_id)
        self.prefill_tokens = metrics.prefill_tokens_inflight.labels(replica_id)
        self._errors: dict[str, Gauge] = {}
        self._learned_cap: Gauge | None = None

    def model_error(self, target: str) -> Gauge:
        """`latency_model_error_ratio{replica,target}` (target: ttft | tpot)."""
        gauge = self._errors.get(target)
        if gauge is None:
            gauge = self._errors[target] = self._metrics.latency_model_error_ratio.labels(
                self._replica_id, target
            )
        return gauge

    def learned_cap(self) -> Gauge:
        """`learned_max_concurrency{replica}`."""
        if self._learned_cap is None:
            self._learned_cap = self._metrics.learned_max_concurrency.labels(self._replica_id)
        return self._learned_cap


class Slot:
    """One request's claim on `replica`, chosen by `decision` (see the module docstring)."""

    __slots__ = (
        "_dispatched_s",
        "_first_token_s",
        "_gauges",
        "_lowest_class",
        "_now_s",
        "_on_release",
        "_released",
        "_running_at_first_token",
        "_sample",
        "decision",
        "replica",
        "tokens",
    )

    def __init__(
        self,
        replica: Replica,
        decision: Decision,
        tokens: int,
        gauges: ReplicaGauges,
        on_release: Callable[[Replica], None],
        *,
        clock: Clock,
        uncached_tokens: int = 0,
        prompt_tokens: int | None = None,
        affinity_tokens: int | None = None,
        lowest_class: bool = False,
    ) -> None:
        self.replica = replica
        self.decision = decision
        self.tokens = tokens
        self._gauges = gauges
        self._on_release = on_release
        self._released = False
        self._now_s = clock.now_s
        self._dispatched_s = self._now_s()
        self._first_token_s: float | None = None
        self._running_at_first_token = 0.0
        self._sample = replica.cost.dispatched(
            uncached_tokens,
            replica.engine,
            inflight=replica.inflight_requests,
            prompt_tokens=prompt_tokens,
            affinity_tokens=affinity_tokens,
        )
        replica.inflight_requests += 1
        replica.inflight_tokens += tokens
        self._lowest_class = lowest_class
        replica.lowest_class_inflight += lowest_class
        replica.breaker.on_dispatch()
        gauges.inflight.inc()
        self._publish_prefill()

    @property
    def released(self) -> bool:
        """True once `release()` ran."""
        return self._released

    @property
    def decoding(self) -> bool:
        """True once the replica produced this request's first token (`first_token`)."""
        return self._first_token_s is not None

    def first_token(self, *, learn: bool = True) -> None:
        """The replica produced this request's first content token (once; later calls do nothing).
        `learn` False: count it, but teach the model nothing (e.g. a continuation's prompt)."""
        if self._first_token_s is not None or self._released:
            return
        now_s = self._now_s()
        self._first_token_s = now_s
        cost = self.replica.cost
        cost.first_token(self._sample, now_s - self._dispatched_s if learn else None)
        self._running_at_first_token = cost.running(self.replica.engine)
        self._publish_prefill()
        if learn and cost.model is not None:
            self._publish_error("ttft", cost.model.ttft_error.value)

    def finished(self, output_tokens: int) -> None:
        """The response ended with `output_tokens`: learn its TPOT (streams with ≥ 2 tokens only)."""
        if self._first_token_s is None or self._released or output_tokens < 2:
            return
        cost = self.replica.cost
        tpot_s = (self._now_s() - self._first_token_s) / (output_tokens - 1)
        running = (self._running_at_first_token + cost.running(self.replica.engine)) / 2
        cost.learn_tpot(running, self.replica.engine, tpot_s, self.replica.inflight_requests)
        if cost.model is not None:
            self._publish_error("tpot", cost.model.tpot_error.value)
            self._gauges.learned_cap().set(cost.learned_cap or 0)

    def _publish_prefill(self) -> None:
        tokens = self.replica.cost.prefill_tokens_inflight
        self._gauges.prefill_tokens.set(tokens)

    def _publish_error(self, target: str, value: float | None) -> None:
        """The model's error for `target` (ttft | tpot), once it has one."""
        if value is not None:
            self._gauges.model_error(target).set(value)

    def release(self) -> None:
        """Give the place back (idempotent); the registry then tells its release listeners."""
        if self._released:
            return
        self._released = True
        self.replica.inflight_requests -= 1
        self.replica.inflight_tokens -= self.tokens
        self.replica.lowest_class_inflight -= self._lowest_class
        self.replica.cost.ended(self._sample, decoding=self._first_token_s is not None)
        self.replica.breaker.on_release()
        self._gauges.inflight.dec()
        if self._first_token_s is None:
            self._publish_prefill()
        self._on_release(self.replica)
