"""Contention for slot credits between gateway instances: a starving pool's presence lease, and the count
of the other instances' presences that sets this instance's share.

- Presence (`update_presence`): a pool that has waiters and a replica refused it for lack of room
  (`PoolCredits.starving`) takes the presence lease `pool-demand/{model}` (cap `PRESENCE_CAP`, so it is
  never refused for room); it is renewed with the credits and given back once the pool had no waiter
  for a linger.
- Count (`refresh_contention`): a pool that holds credits, a presence or waiters counts the presences
  every `CONTENTION_REFRESH_S`; the others' count is `PoolCredits.others_starving`, from which the
  ledger derives the share. When it falls, the pool's `on_credit` runs (the limit may have risen).
"""

from __future__ import annotations

import math

from gateway.upstream.slot_credit_ledger import CreditMode, HeldCredit, PoolCredits
from gateway.upstream.slot_credit_store_link import CreditStoreLink

CONTENTION_REFRESH_S = 0.25
PRESENCE_CAP = 1 << 20


async def refresh_contention(link: CreditStoreLink, pc: PoolCredits) -> None:
    """Count the other instances starving on `pc`'s pool, when due."""
    now_s = link.clock.now_s()
    if now_s < pc.checked_s + CONTENTION_REFRESH_S:
        return
    if not (pc.held() or pc.presence is not None or pc.waiting()):
        pc.others_starving = 0
        return
    pc.checked_s = now_s
    (count,) = await link.calls([link.store.count(pc.presence_id)])
    if link.mode is not CreditMode.SHARED:
        return
    others = max(0, count - (1 if pc.presence is not None else 0))
    before, pc.others_starving = pc.others_starving, others
    if others < before:
        pc.on_credit()


async def update_presence(link: CreditStoreLink, pc: PoolCredits, linger_s: float) -> None:
    """Take the presence lease when the pool starves; give it back a linger after its last waiter."""
    now_s = link.clock.now_s()
    if pc.presence is None and pc.starving:
        (lease,) = await link.calls([link.store.acquire(pc.presence_id, PRESENCE_CAP, link.ttl_s)])
        if lease is not None and not lease.degraded:
            pc.presence = HeldCredit(lease, link.renew_at_s(link.clock.now_s()))
            pc.checked_s = -math.inf
    elif pc.presence is not None and pc.waiting() == 0 and now_s - pc.last_waiting_s >= linger_s:
        held, pc.presence = pc.presence, None
        await link.release([held])
