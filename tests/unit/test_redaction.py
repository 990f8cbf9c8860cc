"""Credentials never shown: the one redaction function (`core.redaction`) and the places that call it —
error messages, configuration errors, the Redis outage log line, the start-up log."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from core.redaction import REDACTED, redact
from core.shared_state import RedisBackend, make_redis_client
from core.state_outage import RedisOperation
from gateway.base.errors import BadRequest, UpstreamConnectError
from gateway.config.settings import ConfigError, parse_settings
from gateway.uvicorn_runner import log_shared_state

SECRET = "hunter2-s3cret"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"redis://:{SECRET}@10.0.0.5:6379/0", "redis://:***@10.0.0.5:6379/0"),
        (f"rediss://app:{SECRET}@redis.internal/2", "rediss://app:***@redis.internal/2"),
        (f"https://{SECRET}@collector:4318/v1/traces", "https://***@collector:4318/v1/traces"),
        (f"redis://:p@ss{SECRET}@h:1/0", "redis://:***@h:1/0"),  # an unescaped @ in the password
        (f"cannot reach redis://u:{SECRET}@h:1/0 (refused)", "cannot reach redis://u:***@h:1/0 (refused)"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("http://host/path?who=a@b.c", "http://host/path?who=a@b.c"),
        ("mail alice@example.com", "mail alice@example.com"),
    ],
)
def test_a_url_loses_its_password_and_nothing_else(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_a_configuration_tree_keeps_its_shape_and_loses_its_secrets() -> None:
    tree = {
        "state": {"url": f"redis://:{SECRET}@h:6379/0", "timeout_s": 0.25},
        "tracing": {"headers": {"authorization": f"Bearer {SECRET}", "x-team": "ml"}, "endpoint": None},
        "admin": {"api_key_env": "LLM_GATEWAY_ADMIN_KEY"},
        "tenants": [{"name": "a", "api_key_hashes": ["ab" * 32]}],
        "other": {"password": SECRET, "client_secret": SECRET, "max_tokens": 5, "token_path": "/var/t"},
    }
    out = redact(tree)
    assert SECRET not in repr(out)
    assert out["state"] == {"url": "redis://:***@h:6379/0", "timeout_s": 0.25}
    assert out["tracing"]["headers"] == {"authorization": REDACTED, "x-team": REDACTED}
    assert out["admin"] == tree["admin"] and out["tenants"] == tree["tenants"]
    assert out["other"] == {
        "password": REDACTED,
        "client_secret": REDACTED,
        "max_tokens": 5,
        "token_path": "/var/t",
    }


def test_error_messages_never_carry_a_credential() -> None:
    for error in (
        BadRequest(f"bad redis://:{SECRET}@h/0"),
        UpstreamConnectError(f"connect to http://u:{SECRET}@h:1 failed", replica_id="h:1"),
    ):
        assert SECRET not in error.message and SECRET not in str(error)
    with pytest.raises(ConfigError) as raised:
        parse_settings({"state": {"backend": "redis", "url": f"redis://:{SECRET}@h/0", "on_error": "maybe"}})
    assert SECRET not in str(raised.value)
    assert SECRET not in str(ConfigError(f"state.url: redis://:{SECRET}@h/0 is unreachable"))


async def test_the_redis_outage_line_never_carries_a_credential(caplog: pytest.LogCaptureFixture) -> None:
    backend = RedisBackend(make_redis_client("redis://127.0.0.1:1/0"))

    async def script(keys: list[str], args: list[str]) -> None:
        raise RedisConnectionError(f"Error connecting to redis://:{SECRET}@10.0.0.5:6379/0")

    with caplog.at_level(logging.WARNING):
        assert await backend.run(RedisOperation.RESPONSE_STATE_GET, script, [], []) is None  # type: ignore[arg-type]
    await backend.aclose()
    assert "redis unreachable" in caplog.text and "redis://:***@10.0.0.5" in caplog.text
    assert SECRET not in caplog.text


def test_the_start_up_line_names_redis_without_its_password(caplog: pytest.LogCaptureFixture) -> None:
    settings = parse_settings({"state": {"backend": "redis", "url": f"redis://:{SECRET}@10.0.0.5:6379/0"}})
    runner_log = logging.getLogger("uvicorn.error")  # uvicorn may have stopped it propagating to root
    runner_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="uvicorn.error"):
            log_shared_state(settings)
    finally:
        runner_log.removeHandler(caplog.handler)
    assert "shared state: Redis at redis://:***@10.0.0.5:6379/0" in caplog.text and SECRET not in caplog.text
