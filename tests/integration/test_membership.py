"""Discovery events applied to a running gateway: joins get traffic, a draining replica finishes its
in-flight stream but gets nothing new, and a removed replica leaves once idle."""

from __future__ import annotations

import httpx

from gateway.upstream.discovery.types import ReplicaSet
from tests.integration.conftest import MODEL, pool
from tests.servers import gateway_settings, wait_until

CHAT = "/v1/chat/completions"


def _body(**extra: object) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **extra}


def test_join_drain_and_leave(mock_engines, gateways) -> None:
    first, second = mock_engines(model=MODEL, token_delay_ms=10), mock_engines(model=MODEL, token_delay_ms=10)
    gateway = gateways(gateway_settings([pool([first], policy="round-robin")]))
    registry = gateway.app.state.registry
    target_pool = registry.pools[MODEL]

    async def apply(target: ReplicaSet) -> None:
        registry.apply_membership(target_pool, target)

    first_id, second_id = (e.url.removeprefix("http://") for e in (first, second))
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        gateway.call(apply(ReplicaSet.of(ready=[first.url, second.url])))
        seen = {client.post(CHAT, json=_body()).headers["x-gateway-replica"] for _ in range(4)}
        assert seen == {first_id, second_id}, "the joined replica takes traffic"

        with client.stream("POST", CHAT, json=_body(stream=True, max_tokens=40)) as held:
            held_id = held.headers["x-gateway-replica"]
            other_url = second.url if held_id == first_id else first.url
            gateway.call(apply(ReplicaSet.of(ready=[other_url])))
            assert registry.pools[MODEL].replicas[held_id].is_draining
            for _ in range(4):
                assert client.post(CHAT, json=_body()).headers["x-gateway-replica"] != held_id
            lines = [line for line in held.iter_lines() if line]
            assert lines[-1] == "data: [DONE]", "the in-flight stream on the leaving replica finishes"
        assert wait_until(lambda: held_id not in target_pool.replicas), "removed once idle"
        text = client.get("/metrics").text
        assert f'llm_gateway_inflight{{replica="{held_id}"}}' not in text
        assert f'llm_gateway_replicas{{pool="{MODEL}",state="ready"}} 1.0' in text
