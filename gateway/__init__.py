"""The HTTP gateway: API, streaming proxy, upstream registry, settings, metrics, CLI, app factory."""
