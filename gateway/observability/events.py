"""The serve path's event port: it makes one call per event; metrics, spans, the access log and the
autoscaling signal subscribe.

    event            when                                                 subscribers
    arrived          admission begins (containment let the request in)    spans · autoscaling
    admitted         admission dispatched it, after its queue wait         spans · autoscaling
    refused          admission refused it                                  spans
    attempt_started  a leg of try n goes to a slot's replica               spans · access log
    relay_started    that replica answered 2xx: relaying begins            spans
    attempt_ended    the leg ended: served (None), or its failure          spans · access log
    prefilled        a prefill leg answered (a disaggregated pool)         autoscaling
    retried          another try follows (the failure kind, or `stale_connection`)   metrics · spans · log
    continued        a broken stream goes on from another replica          metrics · spans · log
    charged          a failed try was charged to its cause                 metrics · spans · log
    served           the request got its whole answer                      autoscaling
    failed           the serve path ends with an error                     spans · log
    finished         the handler's end of any request, with its outcome    metrics · spans · log

A sink subclasses `ServeEventSink` and overrides the events it wants; the composition root subscribes
it (`ServeEvents(sinks)`). Each event is bound once, at construction, to the sinks that override it:
an event nobody subscribed to is a shared no-op, an event with one subscriber calls it directly. So a
feature that is off adds no per-request work: with tracing and access log off no record sink is
subscribed, and without an `autoscale:` pool no autoscaling sink. Sinks run in subscription order and
must not raise.

The spans and the access log are per request (`RequestRecord`, `ctx.record`): their sink
(`gateway.observability.record_events.RecordSink`) forwards each event to the request's record. The
record's hooks that are not events of the serve path stay on it: the parsed body and the context
(`request_parsed`, `bind`), and the relay's per-chunk ones that only spans read (`upstream_headers`,
`first_token`, `finish_reason`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.base.errors import GatewayError
    from gateway.observability.request_record import RequestRecord
    from gateway.proxy.context import RequestContext
    from gateway.proxy.failure_charges import Charge
    from gateway.proxy.reply import Reply
    from gateway.upstream.pool import Pool
    from gateway.upstream.slot import Slot


class ServeEventSink:
    """A subscriber of the serve path's events (module docstring): each does nothing unless overridden."""

    def arrived(self, ctx: RequestContext, queue_depth: Callable[[], int]) -> None:
        """Admission begins; `queue_depth()` is the pool's queue length now."""

    def admitted(self, ctx: RequestContext, queue_wait_s: float) -> None:
        """Admission dispatched the request after `queue_wait_s`."""

    def refused(self, ctx: RequestContext, error: GatewayError) -> None:
        """Admission refused the request with `error`."""

    def attempt_started(self, ctx: RequestContext, number: int, slot: Slot) -> None:
        """A leg of try `number` goes to `slot`'s replica (a new slot: a new routing decision)."""

    def relay_started(self, ctx: RequestContext) -> None:
        """The leg's replica answered 2xx; relaying it to the client begins."""

    def attempt_ended(self, ctx: RequestContext, failure: BaseException | None) -> None:
        """The current leg ended: served (None), or `failure` (an upstream error, a stale connection)."""

    def prefilled(self, ctx: RequestContext, pool: Pool, leg_s: float) -> None:
        """A prefill leg on set `pool` answered after `leg_s` (disaggregated pools)."""

    def retried(self, ctx: RequestContext, reason: str) -> None:
        """Another try follows a failure before the first byte (`reason`: the failure kind, or
        `stale_connection`)."""

    def continued(self, ctx: RequestContext) -> None:
        """A broken stream continues on another replica."""

    def charged(self, ctx: RequestContext, pool: Pool, charge: Charge) -> None:
        """A failed try on a replica of set `pool` was charged to its cause."""

    def served(self, ctx: RequestContext, reply: Reply) -> None:
        """The request got its whole answer (its usage, timings and queue wait are `reply`'s)."""

    def failed(self, ctx: RequestContext, error: GatewayError) -> None:
        """The serve path ends with `error` (answered by the handler)."""

    def finished(
        self,
        reply: Reply,
        outcome: str,
        *,
        tenant: str | None,
        pool: Pool | None,
        stream: bool,
        record: RequestRecord,
    ) -> None:
        """Any request ended with `outcome` (the handler, once, after the answer; `pool` None when it
        never reached one)."""


EVENTS = tuple(name for name in vars(ServeEventSink) if not name.startswith("_"))


def _ignored(*args: Any, **kwargs: Any) -> None:
    """An event nobody subscribed to."""


def _fan_out(handlers: list[Callable[..., None]]) -> Callable[..., None]:
    if not handlers:
        return _ignored
    if len(handlers) == 1:
        return handlers[0]
    chain = tuple(handlers)

    def each(*args: Any, **kwargs: Any) -> None:
        for handler in chain:
            handler(*args, **kwargs)

    return each


class ServeEvents:
    """The port (module docstring): call `events.<event>(...)`; one per app."""

    arrived: Callable[[RequestContext, Callable[[], int]], None]
    admitted: Callable[[RequestContext, float], None]
    refused: Callable[[RequestContext, GatewayError], None]
    attempt_started: Callable[[RequestContext, int, Slot], None]
    relay_started: Callable[[RequestContext], None]
    attempt_ended: Callable[[RequestContext, BaseException | None], None]
    prefilled: Callable[[RequestContext, Pool, float], None]
    retried: Callable[[RequestContext, str], None]
    continued: Callable[[RequestContext], None]
    charged: Callable[[RequestContext, Pool, Charge], None]
    served: Callable[[RequestContext, Reply], None]
    failed: Callable[[RequestContext, GatewayError], None]
    finished: Callable[..., None]
    """`ServeEventSink.finished`'s arguments."""

    def __init__(self, sinks: Sequence[ServeEventSink | None]) -> None:
        """Subscribe `sinks` (None: a feature that is off), in order."""
        subscribed = [sink for sink in sinks if sink is not None]
        self.sinks = tuple(subscribed)
        for name in EVENTS:
            default = getattr(ServeEventSink, name)
            handlers = [getattr(s, name) for s in subscribed if getattr(type(s), name) is not default]
            setattr(self, name, _fan_out(handlers))
