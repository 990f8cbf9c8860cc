"""Each pool's engine API key, read from the environment variable its settings name
(`pools[].engine_api_key_env`; a pool without one sends no key). A name that is set but missing or
empty in the environment is a `ConfigError` naming the pool's index and the variable.
"""

from __future__ import annotations

import os

from gateway.config.settings import ConfigError, Settings


def engine_keys(settings: Settings) -> dict[str, str]:
    """Pool model → its engine key, for the pools that name a variable."""
    keys: dict[str, str] = {}
    for index, pool in enumerate(settings.pools):
        name = pool.engine_api_key_env
        if name is None:
            continue
        value = os.environ.get(name)
        if not value:
            raise ConfigError(f"pools.{index}.engine_api_key_env: environment variable {name} is not set")
        keys[pool.model] = value
    return keys
