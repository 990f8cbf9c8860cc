"""Slot credits on the real Redis while it goes away and comes back (a TCP proxy in between): the
configured `on_error` applies, every failure is counted, and the credits recover by themselves."""

from __future__ import annotations

import pytest

from admission.leases import LeaseScope
from admission.redis_leases import RedisLeaseStore
from core.clock import FakeClock
from core.state_outage import FailureMode, RedisOperation
from gateway.upstream.slot_credit_ledger import CreditMode
from tests.unit.gateway.test_slot_credits import RIDS, TTL_S, instance, slots

from .conftest import BackendFactory, TcpProxy

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("on_error", [FailureMode.FAIL_OPEN, FailureMode.FAIL_CLOSED])
async def test_credits_follow_on_error_while_redis_is_down_and_recover(
    make_backend: BackendFactory, redis_proxy: TcpProxy, on_error: FailureMode
) -> None:
    clock = FakeClock(start_s=1000.0)
    errors: list[RedisOperation] = []
    backend = make_backend(
        redis_proxy.url, on_error=on_error, script_time=clock, clock=clock, on_error_callback=errors.append
    )
    store = RedisLeaseStore(backend, LeaseScope.REPLICA)
    one = instance(store, clock, health=backend)
    await one.submit(1)
    await one.step()
    assert len(one.grants) == 1 and one.credits.mode is CreditMode.SHARED

    await redis_proxy.stop()
    clock.advance(TTL_S / 3)
    await one.step()  # the renewal cannot reach Redis
    assert RedisOperation.LEASE_RENEW in errors
    await one.submit(4)
    await one.collect()
    if on_error is FailureMode.FAIL_OPEN:
        assert one.credits.mode is CreditMode.LOCAL
        assert len(one.grants) == 4  # each replica's own cap (2), as with memory state
    else:
        assert one.credits.mode is CreditMode.CLOSED
        assert len(one.grants) == 1 and len(one.controller) == 4  # no new dispatch

    await redis_proxy.start()
    clock.advance(1.0)  # the next probe
    await one.step()
    assert one.credits.mode is CreditMode.SHARED
    served = 0
    for _ in range(5):
        served += len(one.grants)
        await one.finish(len(one.grants))
        await one.step()
        for rid in RIDS:  # the held credits are the leases in Redis, and bound what runs
            assert one.inflight(rid) <= one.held(rid) == await store.count(slots(rid)) <= 2
    assert served == 5 and len(one.controller) == 0
    await one.credits.aclose()
    assert [await store.count(slots(rid)) for rid in RIDS] == [0, 0]
