"""The spans' and the access log's subscription to the serve path's events (`gateway.observability.
events`): each event goes to the request's own `RequestRecord` (`ctx.record`; the `finished` event
names it). The composition root subscribes it only when the observer makes records (tracing or access
log on), so with both off no event reaches a record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.observability.events import ServeEventSink

if TYPE_CHECKING:
    from gateway.base.errors import GatewayError
    from gateway.observability.request_record import RequestRecord
    from gateway.proxy.context import RequestContext
    from gateway.proxy.failure_charges import Charge
    from gateway.proxy.reply import Reply
    from gateway.upstream.pool import Pool
    from gateway.upstream.slot import Slot


class RecordSink(ServeEventSink):
    """Forwards the events to each request's record (module docstring)."""

    def arrived(self, ctx: RequestContext, queue_depth: Callable[[], int]) -> None:
        ctx.record.admission_started(queue_depth)

    def admitted(self, ctx: RequestContext, queue_wait_s: float) -> None:
        ctx.record.admission_ended(queue_wait_s)

    def refused(self, ctx: RequestContext, error: GatewayError) -> None:
        ctx.record.admission_ended(None, error)

    def attempt_started(self, ctx: RequestContext, number: int, slot: Slot) -> None:
        ctx.record.attempt_started(number, slot)

    def relay_started(self, ctx: RequestContext) -> None:
        ctx.record.relay_started()

    def attempt_ended(self, ctx: RequestContext, failure: BaseException | None) -> None:
        ctx.record.attempt_ended(failure)

    def retried(self, ctx: RequestContext, reason: str) -> None:
        ctx.record.retried(reason)

    def continued(self, ctx: RequestContext) -> None:
        ctx.record.continued()

    def charged(self, ctx: RequestContext, pool: Pool, charge: Charge) -> None:
        kind = "none" if charge.kind is None else str(charge.kind)
        ctx.record.failure_charged(charge.replica.replica_id, kind, str(charge.cause))

    def failed(self, ctx: RequestContext, error: GatewayError) -> None:
        ctx.record.failed(error)

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
        record.finish(reply, outcome, tenant)
