"""The composition root builds every component from settings and closes them in reverse order."""

from __future__ import annotations

import pytest

from gateway.composition import Components
from gateway.config.settings import parse_settings
from gateway.fleet.shared_state_assembly import state_backend
from gateway.upstream.health import HealthChecker
from tests.servers import free_port


def settings(**state: object) -> object:
    pool = {"model": "m", "replicas": {"static": [f"http://127.0.0.1:{free_port()}"]}}
    return parse_settings({"pools": [pool], "state": state or {"backend": "memory"}})


async def test_start_builds_the_serve_path_and_aclose_closes_it_in_reverse_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    components = Components(settings())  # type: ignore[arg-type]
    assert components.registry.pools and not components.ready(), "registry before start, nothing to serve"
    closed: list[str] = []
    original_stop = HealthChecker.stop

    async def recording_stop(self: HealthChecker) -> None:
        assert components.control_client is not None
        closed.append(f"health (control client open: {not components.control_client.is_closed})")
        await original_stop(self)

    monkeypatch.setattr(HealthChecker, "stop", recording_stop)
    await components.start()
    assert components.proxy is not None and components.session is not None and components.ready()
    assert components.state_backend is None, "memory state: no Redis connection"
    session, control = components.session, components.control_client
    assert control is not None
    await components.aclose()
    assert closed == ["health (control client open: True)"], "loops stop before the clients they use close"
    assert session.closed and control.is_closed and components.proxy is None
    await components.aclose()  # idempotent


async def test_a_failure_while_starting_closes_what_was_already_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    components = Components(settings())  # type: ignore[arg-type]

    def broken_start(self: HealthChecker) -> None:
        raise RuntimeError("health checker failed to start")

    monkeypatch.setattr(HealthChecker, "start", broken_start)
    with pytest.raises(RuntimeError, match="health checker"):
        await components.start()
    assert components.session is None and components.proxy is None


async def test_redis_state_builds_one_backend_that_closes_last() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    components = Components(settings(backend="redis", url=url, timeout_s=1.5))  # type: ignore[arg-type]
    await components.start()
    backend = components.state_backend
    assert backend is not None, "one shared-state backend for the gate, the credits and idempotency"
    assert backend.timeout_s == 1.5, "state.timeout_s reaches the Redis client"
    await components.aclose()
    assert components.state_backend is None


@pytest.mark.parametrize(("timeout_s", "warned"), [(0.25, []), (1.0, ["state.replica_lease_ttl_s / 3"])])
def test_a_redis_timeout_that_outlasts_a_renewal_period_is_warned_at_start(
    timeout_s: float, warned: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """4 × 1 s may outlast the slot credits' renewal (10 s / 3), not the idempotency claim's (30 s / 3):
    each period a slow call could outlast is named once, and the default 0.25 s names none."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    config = parse_settings(
        {
            "state": {"backend": "redis", "url": url, "timeout_s": timeout_s, "replica_lease_ttl_s": 10},
            "idempotency": {"lease_s": 30},
        }
    )
    metrics = Components(config).metrics
    with caplog.at_level("WARNING", logger="gateway.fleet.shared_state_assembly"):
        state_backend(config, metrics)
    named = [p for p in ("state.replica_lease_ttl_s / 3", "idempotency.lease_s / 3") if p in caplog.text]
    assert named == warned
