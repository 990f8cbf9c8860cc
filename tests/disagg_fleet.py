"""Real mock engines in disaggregated roles (vLLM's kv_transfer_params legs, SGLang's bootstrap legs)
and the settings of a disaggregated pool over them, for the integration tests and the fault matrix.

The mock replicas refuse any leg whose fields are missing or wrong (a prefill that is asked to stream or
to decode, a decode without a valid transfer or room: 400 naming the field), and a decode claims the KV
from the prefill named in its leg, so a served request proves the wire shapes and the pairing. A
decode's text is the aggregated engine's for the same prompt and seed (`aggregated_answer`).
"""

from __future__ import annotations

from typing import Any

import httpx

from mock_engine.disagg_params import Protocol, Role
from mock_engine.disagg_role import DisaggConfig
from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.physics.kv_link import KvLink
from mock_engine.server import MockEngineApp, MockEngineConfig
from tests.servers import ServerThread, start_mock_engine
from tests.waiting import wait_for

LINK = KvLink("test", bandwidth_bytes_per_s=10_000_000)  # 1 000 B/token: 10 000 tokens/s


def disagg_engine(
    model: str,
    role: Role,
    protocol: Protocol,
    faults: FaultSettings | None = None,
    *,
    first_token_s: float = 0.02,
    token_s: float = 0.001,
) -> ServerThread:
    """A started mock engine playing `role` of `protocol`."""
    disagg = DisaggConfig(
        role=role, protocol=protocol, kv_bytes_per_token=1000, link=LINK, bootstrap_timeout_s=5
    )
    core = FixedDelayCore(first_token_s, token_s)
    app = MockEngineApp(MockEngineConfig(model=model, disagg=disagg), core, faults or FaultSettings())
    return ServerThread(app, f"mock-{protocol}-{role}").start()


def disagg_pool(
    model: str,
    protocol: Protocol,
    prefill: list[str],
    decode: list[str],
    *,
    prefill_policy: str | None = None,
    decode_policy: str | None = None,
    decode_cap: int | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """A disaggregated pool over those replica URLs (health checks and scrapes off, fast backoffs)."""

    def side(urls: list[str], policy: str | None) -> dict[str, Any]:
        return {"replicas": {"static": urls}} | ({} if policy is None else {"policy": policy})

    return {
        "model": model,
        "disaggregation": {
            "protocol": str(protocol),
            "prefill": side(prefill, prefill_policy),
            "decode": side(decode, decode_policy) | {"max_concurrency_per_replica": decode_cap},
        },
        "health": {"enabled": False},
        "scrape": {"enabled": False},
        "retries": {"backoff_initial_s": 0.001, "backoff_max_s": 0.01},
        **overrides,
    }


def aggregated_answer(model: str, body: dict[str, Any], path: str) -> dict[str, Any]:
    """What an aggregated mock engine answers `body` (not streamed) on `path`."""
    server = start_mock_engine(model=model)
    try:
        return dict(httpx.post(f"{server.url}{path}", json=body, timeout=10).json())
    finally:
        server.stop()


def settled(gateway: ServerThread, servers: list[ServerThread]) -> None:
    """Nothing in flight any more: the gateway's slots on both sets, and the engines still up."""
    registry = gateway.app.state.registry
    wait_for(lambda: registry.total_inflight() == 0, what="gateway in-flight back to zero")
    assert all(r.inflight_requests == 0 for r in registry.all_replicas())
    live = [s for s in servers if not s.server.should_exit]
    wait_for(lambda: all(s.app.counters.active == 0 for s in live), what="engines idle")
