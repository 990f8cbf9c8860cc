"""`llm-gateway mock-engine …` (also `python -m mock_engine …`): serve one mock engine replica."""

from __future__ import annotations

import argparse

from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.server import MockEngineApp, MockEngineConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="mock-model", help="model name served (default: mock-model)")
    parser.add_argument("--first-token-delay-ms", type=float, default=20.0, help="simulated prefill time")
    parser.add_argument("--token-delay-ms", type=float, default=5.0, help="simulated time per output token")
    parser.add_argument(
        "--default-max-tokens", type=int, default=64, help="output length when max_tokens is unset"
    )
    parser.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--error-rate", type=float, default=0.0, help="fraction of requests answered with an error"
    )
    parser.add_argument("--error-status", type=int, default=500)
    parser.add_argument("--log-level", default="warning")


def build_app(args: argparse.Namespace) -> MockEngineApp:
    core = FixedDelayCore(args.first_token_delay_ms / 1000.0, args.token_delay_ms / 1000.0)
    config = MockEngineConfig(model=args.model, default_max_tokens=args.default_max_tokens, speed=args.speed)
    faults = FaultSettings().updated({"error_rate": args.error_rate, "error_status": args.error_status})
    return MockEngineApp(config, core, faults, seed=args.seed)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    uvicorn.run(build_app(args), host=args.host, port=args.port, log_level=args.log_level, lifespan="on")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mock-engine", description="OpenAI-compatible mock LLM engine")
    add_arguments(parser)
    return run(parser.parse_args(argv))
