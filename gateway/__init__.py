"""The HTTP gateway, one folder per layer (docs/ARCHITECTURE.md): base, config, upstream, api,
observability, fleet, proxy, ops; at its root the app, the composition root and the runner."""
