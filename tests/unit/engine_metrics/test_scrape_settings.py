from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config.scrape_settings import OnStale, ScrapeSettings


def test_settings_defaults() -> None:
    settings = ScrapeSettings()
    assert (settings.interval_s, settings.timeout_s, settings.stale_bound_s) == (0.5, 0.4, 1.5)
    assert settings.on_stale is OnStale.SATURATED
    assert settings.path == "/metrics"
    assert settings.enabled is True
    assert ScrapeSettings(interval_s=2, timeout_s=1).stale_bound_s == 6.0
    assert ScrapeSettings(on_stale="ignore", stale_after_s=4).stale_bound_s == 4.0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"interval_s": 0.5, "timeout_s": 0.5}, "timeout_s"),
        ({"stale_after_s": 0.1}, "stale_after_s"),
        ({"on_stale": "panic"}, "on_stale"),
        ({"path": "metrics"}, "path"),
        ({"interval": 1}, "interval"),
        ({"interval_s": 0}, "interval_s"),
    ],
)
def test_settings_validation_names_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ScrapeSettings.model_validate(raw)
