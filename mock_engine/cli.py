"""`llm-gateway mock-engine …` (also `python -m mock_engine …`): serve one mock engine replica.

Fault flags set the initial fault settings (`faults.py`; `docs/MOCK_ENGINE.md`); `POST /mock/faults` changes
them at run time. `--role prefill|decode` makes a replica of a disaggregated pool (`disagg_role.py`); its KV
geometry (bytes per token, block size) and link come from `--profile` whatever the core, `--kv-link` overrides
the profile's link. Models and LoRA adapters (`served_models.py`): `--served-model-name`, `--lora-modules`,
`--max-loras`, `--allow-runtime-lora` (also on when `VLLM_ALLOW_RUNTIME_LORA_UPDATING` is `1` or `true`,
as vLLM reads it), `--max-adapters`, `--check-model`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from mock_engine.core import EngineCore
from mock_engine.disagg_params import Protocol, Role
from mock_engine.disagg_role import DisaggConfig
from mock_engine.faults import FaultSettings, FaultSettingsError
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.metrics_text import FLAVOURS
from mock_engine.physics import (
    DEFAULT_PROFILE_NAME,
    EngineProfile,
    PhysicsCore,
    ProfileError,
    available_profiles,
    calibrate,
    load_profile,
    render_calibration_markdown,
)
from mock_engine.physics.kv_link import DEFAULT_KV_LINK, parse_kv_link
from mock_engine.served_models import LoraModule
from mock_engine.server import MockEngineApp, MockEngineConfig

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"

# (flag, settings field, type, help); a flag's default is "unset": the settings' own default applies
_FAULT_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--error-rate", "error_rate", float, "fraction of requests answered with --error-status (default 0)"),
    ("--error-status", "error_status", int, "status of injected errors: 500, 503, 429... (default 500)"),
    ("--retry-after-s", "retry_after_s", float, "Retry-After seconds sent with injected 429/503"),
    ("--slow-first-token-ms", "slow_first_token_ms", float, "extra wait before the first token (ms)"),
    ("--slow-first-token-rate", "slow_first_token_rate", float, "fraction of requests slowed (default 1)"),
    ("--stall-after-tokens", "stall_after_tokens", int, "go silent after N tokens, connection left open"),
    ("--stall-rate", "stall_rate", float, "fraction of requests that stall (default 1)"),
    ("--crash-after-tokens", "crash_after_tokens", int, "reset the connection after N tokens"),
    ("--crash-rate", "crash_rate", float, "fraction of requests that crash (default 1)"),
    ("--jitter-ms", "jitter_ms", float, "extra pause before each token, uniform in [0, J] ms (seeded)"),
    ("--refuse-for-s", "refuse_for_s", float, "with --refuse-connections: accept again after this long"),
    ("--poison-marker", "poison_marker", str, "requests whose prompt contains this text get --poison-effect"),
    (
        "--poison-effect",
        "poison_effect",
        str,
        "stall, error (500) or crash (default stall)",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="mock-model", help="model name served (default: mock-model)")
    parser.add_argument("--first-token-delay-ms", type=float, default=20.0, help="simulated prefill time")
    parser.add_argument("--token-delay-ms", type=float, default=5.0, help="simulated time per output token")
    parser.add_argument(
        "--default-max-tokens", type=int, default=64, help="output length when max_tokens is unset"
    )
    parser.add_argument(
        "--core",
        choices=("fixed", "physics"),
        default="fixed",
        help="fixed: independent requests with fixed delays; physics: continuous batching, KV capacity and "
        "prefix cache from --profile (default: fixed)",
    )
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE_NAME,
        help=f"physics profile: {', '.join(available_profiles())} or a YAML path "
        f"(default: {DEFAULT_PROFILE_NAME})",
    )
    parser.add_argument(
        "--metrics-flavour",
        choices=FLAVOURS,
        default="vllm",
        help="whose /metrics names to export (default: vllm)",
    )
    parser.add_argument(
        "--calibrate",
        metavar="PROFILE",
        help="print the profile's measured decode table next to its targets, then exit",
    )
    parser.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault decisions")
    parser.add_argument("--log-level", default="warning")
    _add_model_arguments(parser)
    disagg = parser.add_argument_group("disaggregated serving (docs/MOCK_ENGINE.md)")
    disagg.add_argument(
        "--role", choices=[r.value for r in Role], default="both", help="prefill, decode or both (default)"
    )
    disagg.add_argument(
        "--disagg-protocol",
        choices=[p.value for p in Protocol],
        default="vllm",
        help="vllm: kv_transfer_params (NixlConnector); sglang: bootstrap_host/port/room (default: vllm)",
    )
    disagg.add_argument(
        "--kv-link", help="prefill→decode link: nvlink, rdma, tcp or GB/s (default: the profile's, else rdma)"
    )
    disagg.add_argument(
        "--bootstrap-port",
        type=int,
        help="SGLang prefill: port advertised in /get_server_info (default: the HTTP port, which serves it)",
    )
    disagg.add_argument("--advertise-host", help="vLLM prefill: remote_host in kv_transfer_params")
    disagg.add_argument(
        "--bootstrap-timeout-s",
        type=float,
        default=30.0,
        help="decode: wall seconds to wait for the prefill's KV before failing (default 30)",
    )
    disagg.add_argument("--engine-id", help="vLLM prefill: remote_engine_id (default: a random UUID)")
    faults = parser.add_argument_group("fault injection (changeable at run time: POST /mock/faults)")
    for flag, field, kind, help_text in _FAULT_FLAGS:
        faults.add_argument(flag, dest=f"fault_{field}", type=kind, default=None, help=help_text)
    faults.add_argument(
        "--refuse-connections",
        dest="fault_refuse_connections",
        action="store_true",
        default=None,
        help="refuse new TCP connections from the start (see --refuse-for-s)",
    )


def _lora_module(text: str) -> LoraModule:
    try:
        return LoraModule.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def runtime_lora_from_env(environ: dict[str, str] | None = None) -> bool:
    """vLLM's reading of `VLLM_ALLOW_RUNTIME_LORA_UPDATING`: on when it is `1` or `true` (any case)."""
    value = (os.environ if environ is None else environ).get(RUNTIME_LORA_ENV, "0")
    return value.strip().lower() in ("1", "true")


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models and LoRA adapters (docs/MOCK_ENGINE.md)")
    models.add_argument(
        "--served-model-name",
        nargs="+",
        metavar="NAME",
        help="the base model's names (the first is answered); --model is then its root (default: --model)",
    )
    models.add_argument(
        "--lora-modules",
        nargs="+",
        action="extend",
        type=_lora_module,
        default=[],
        metavar="NAME[=PATH]",
        help="adapters served from the start, repeatable (path default: /mock-loras/NAME)",
    )
    models.add_argument(
        "--max-loras", type=_at_least_one, default=1, help="most adapters in the running batch (default 1)"
    )
    models.add_argument(
        "--allow-runtime-lora",
        action="store_true",
        default=runtime_lora_from_env(),
        help=f"serve /v1/load_lora_adapter and /v1/unload_lora_adapter (default: ${RUNTIME_LORA_ENV})",
    )
    models.add_argument(
        "--max-adapters", type=_at_least_one, help="mock only: most adapters listed at once (default: none)"
    )
    models.add_argument(
        "--check-model",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="404 for a model not served (default: on with adapters, runtime loading or several names)",
    )


def fault_settings(args: argparse.Namespace) -> FaultSettings:
    """The initial fault settings from the flags given (raises `FaultSettingsError`)."""
    prefix = "fault_"
    changes = {
        name[len(prefix) :]: value
        for name, value in vars(args).items()
        if name.startswith(prefix) and value is not None
    }
    return FaultSettings().updated(changes)


def build_core(args: argparse.Namespace) -> tuple[EngineCore, int | None]:
    """The serving model and its context limit (prompt + max_tokens; None when unbounded)."""
    if args.core == "physics":
        core = PhysicsCore(load_profile(args.profile))
        return core, core.kv_capacity_tokens
    return FixedDelayCore(args.first_token_delay_ms / 1000.0, args.token_delay_ms / 1000.0), None


def disagg_config(args: argparse.Namespace) -> DisaggConfig:
    """The replica's role, protocol and KV link (raises `ProfileError` for a bad profile or link)."""
    profile: EngineProfile = load_profile(args.profile)
    link = parse_kv_link(args.kv_link) if args.kv_link else (profile.kv_link or DEFAULT_KV_LINK)
    extra = {"engine_id": args.engine_id} if args.engine_id else {}
    return DisaggConfig(
        role=Role(args.role),
        protocol=Protocol(args.disagg_protocol),
        kv_bytes_per_token=profile.kv_bytes_per_token,
        link=link,
        block_size_tokens=profile.scheduler.block_size_tokens,
        advertise_host=args.advertise_host,
        bootstrap_port=args.bootstrap_port,
        bootstrap_timeout_s=args.bootstrap_timeout_s,
        **extra,
    )


def build_app(args: argparse.Namespace) -> MockEngineApp:
    core, max_context_tokens = build_core(args)
    names = args.served_model_name or [args.model]
    config = MockEngineConfig(
        model=names[0],
        model_aliases=tuple(names[1:]),
        model_root=args.model,
        lora_modules=tuple(args.lora_modules),
        max_loras=args.max_loras,
        allow_runtime_lora=args.allow_runtime_lora,
        max_adapters=args.max_adapters,
        check_model=args.check_model,
        default_max_tokens=args.default_max_tokens,
        speed=args.speed,
        metrics_flavour=args.metrics_flavour,
        max_context_tokens=max_context_tokens,
        disagg=disagg_config(args),
    )
    return MockEngineApp(config, core, fault_settings(args), seed=args.seed)


def print_calibration(profile_name: str) -> int:
    profile = load_profile(profile_name)
    print(render_calibration_markdown(profile.name, calibrate(profile)))
    return 0


def run(args: argparse.Namespace) -> int:
    import uvicorn

    try:
        if args.calibrate:
            return print_calibration(args.calibrate)
        app = build_app(args)
    except (FaultSettingsError, ProfileError, ValueError) as exc:
        print(f"mock-engine: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="on")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mock-engine", description="OpenAI-compatible mock LLM engine")
    add_arguments(parser)
    return run(parser.parse_args(argv))
