"""`llm-gateway`'s argument parser and its gateway subcommands (serve, check-config, hash-key, demo);
`alerts` (cli/alerts.py), `plan`, `bench` and `mock-engine` are wired to their modules' `add_arguments` /
`run`.

Exit codes: 0 ok, 1 `serve` with several workers when one exited unasked or not cleanly
(`gateway.ops.workers`), 2 an invalid config or bad arguments, 3 `serve` cannot start (the address
cannot be bound, or several workers on memory state cannot start their local state server); `plan`,
`bench` and `mock-engine` return their own (see each package's `cli` module).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from bench import cli as bench_cli
from capacity import cli as capacity_cli
from cli import alerts as alerts_cli
from gateway.config.settings import ConfigError, Settings, load_settings
from mock_engine import cli as mock_cli


def _settings(args: argparse.Namespace) -> Settings | None:
    """The validated config of `--config` (or $LLM_GATEWAY_CONFIG); None after printing why not."""
    try:
        return load_settings(args.config)
    except ConfigError as exc:
        print(f"llm-gateway: {exc}", file=sys.stderr)
        return None


def _serve(args: argparse.Namespace) -> int:
    from gateway.uvicorn_runner import serve

    settings = _settings(args)
    if settings is None:
        return 2
    return serve(settings, log_level=args.log_level)


def _check_config(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if settings is None:
        return 2
    print(f"ok: {len(settings.pools)} pool(s): " + ", ".join(p.model for p in settings.pools))
    return 0


def _hash_key(args: argparse.Namespace) -> int:
    """Print the sha256 hex digest of each API key read from stdin (one per line) for `tenants:`."""
    from admission import tenants

    return tenants.main()


def _demo(args: argparse.Namespace) -> int:
    from cli.demo import run_demo

    try:
        return run_demo(gateway_port=args.port)
    except KeyboardInterrupt:
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm-gateway", description="OpenAI-compatible LLM routing gateway")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway from a YAML config")
    serve.add_argument("--config", help="config file (default: $LLM_GATEWAY_CONFIG)")
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("--config", help="config file (default: $LLM_GATEWAY_CONFIG)")
    check.set_defaults(func=_check_config)

    alerts = sub.add_parser("alerts", help="print Prometheus SLO burn-rate and cost rules for a config")
    alerts_cli.add_arguments(alerts)
    alerts.set_defaults(func=alerts_cli.run)

    hash_key = sub.add_parser(
        "hash-key", help="print sha256 digests of API keys read from stdin (for tenants:)"
    )
    hash_key.set_defaults(func=_hash_key)

    demo = sub.add_parser("demo", help="three mock engines and the gateway on 127.0.0.1")
    demo.add_argument("--port", type=int, default=8080)
    demo.set_defaults(func=_demo)

    plan = sub.add_parser("plan", help="capacity plan: replicas from the three barriers, cost, spike backlog")
    capacity_cli.add_arguments(plan)
    plan.set_defaults(func=capacity_cli.run)

    bench = sub.add_parser("bench", help="load generator and benchmarks (run, compare, sweep, overhead)")
    bench_cli.add_arguments(bench)
    bench.set_defaults(func=bench_cli.run)

    mock = sub.add_parser("mock-engine", help="run one mock engine replica")
    mock_cli.add_arguments(mock)
    mock.set_defaults(func=mock_cli.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    raise SystemExit(main())
