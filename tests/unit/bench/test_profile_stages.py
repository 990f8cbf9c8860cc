"""Sampled stacks of the serve path → stages (bench/profile_stages.py): the innermost mapped frame
decides, transparent modules take their caller's stage, the aiohttp client only when nothing above it
is mapped; both of py-spy's path forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.profile_stages import (
    ADMISSION,
    BACKGROUND,
    HANDLER,
    LOGGING,
    LOOP,
    METRICS,
    OTHER,
    RELAY,
    ROUTING,
    RULES,
    SEND,
    SERVE_LOOP,
    SERVER,
    SPANS,
    STAGES,
    module_of,
    parse_folded,
    shares,
    stage_of,
)

REPO = Path(__file__).resolve().parents[3]

ROOT = "run (asyncio/runners.py:118)"
ASGI = "GatewayApp.__call__ (gateway/app.py:120)"
HANDLE = "ProxyHandler.handle (gateway/proxy/handler.py:80)"
SERVE = "RequestServer.serve (gateway/proxy/serving.py:50)"


def f(path: str, func: str = "fn") -> str:
    return f"{func} ({path}:1)"


@pytest.mark.parametrize(
    ("path", "module"),
    [
        ("gateway/proxy/handler.py", "gateway/proxy/handler.py"),
        ("/work/x/gateway/proxy/handler.py", "gateway/proxy/handler.py"),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/logging/__init__.py", "logging/__init__.py"),
        ("/w/.venv/lib/python3.11/site-packages/aiohttp/client.py", "aiohttp/client.py"),
        (
            "/w/.venv/lib/python3.11/site-packages/uvicorn/protocols/http/httptools_impl.py",
            "uvicorn/protocols/http/httptools_impl.py",
        ),
        ("/srv/repo/router/ring.py", "router/ring.py"),
        ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap>"),
    ],
)
def test_module_of_either_path_form(path: str, module: str) -> None:
    assert module_of(path) == module


@pytest.mark.parametrize(
    ("leaf", "stage"),
    [
        ("uvicorn/protocols/http/httptools_impl.py", SERVER),
        ("gateway/api/asgi_io.py", SERVER),
        ("gateway/api/request_parsing.py", HANDLER),
        ("gateway/proxy/tries.py", SERVE_LOOP),
        ("admission/controller.py", ADMISSION),
        ("gateway/proxy/admit.py", ADMISSION),
        ("router/prefix_index.py", ROUTING),
        ("gateway/upstream/slot.py", ROUTING),
        ("gateway/upstream/replica_cost.py", ROUTING),
        ("gateway/proxy/send.py", SEND),
        ("gateway/proxy/sse.py", RELAY),
        ("prometheus_client/metrics.py", METRICS),
        ("gateway/proxy/account.py", METRICS),
        ("gateway/observability/events.py", METRICS),
        ("gateway/observability/request_spans.py", SPANS),
        ("opentelemetry/sdk/trace/__init__.py", SPANS),
        ("logging/__init__.py", LOGGING),
        ("gateway/upstream/scraper.py", BACKGROUND),
    ],
)
def test_the_innermost_mapped_frame_decides(leaf: str, stage: str) -> None:
    assert stage_of([ROOT, ASGI, HANDLE, SERVE, f(leaf)]) == stage


def test_transparent_modules_take_their_callers_stage() -> None:
    json_under_relay = [ROOT, HANDLE, f("gateway/proxy/relay.py"), f("json/encoder.py"), f("typing.py")]
    assert stage_of(json_under_relay) == RELAY
    pydantic_in_handler = [ROOT, ASGI, HANDLE, f("pydantic/main.py")]
    assert stage_of(pydantic_in_handler) == HANDLER


def test_access_log_and_logging_stay_apart() -> None:
    record = [ROOT, SERVE, f("gateway/observability/access_log.py"), f("json/__init__.py")]
    assert stage_of(record) == SPANS
    assert stage_of([*record, f("logging/__init__.py")]) == LOGGING


def test_the_aiohttp_client_counts_for_its_caller_else_for_the_upstream_send() -> None:
    read_by_relay = [ROOT, SERVE, f("gateway/proxy/relay.py"), f("aiohttp/streams.py")]
    assert stage_of(read_by_relay) == RELAY
    sent = [ROOT, SERVE, f("gateway/proxy/send.py"), f("aiohttp/client.py"), f("yarl/_url.py")]
    assert stage_of(sent) == SEND
    loop_callback = [ROOT, f("aiohttp/client_proto.py", "ResponseHandler.data_received")]
    assert stage_of(loop_callback) == SEND


def test_the_event_loops_own_time_is_its_stage() -> None:
    """uvloop runs C below asyncio's runner: a sample whose innermost Python frame is the runner (under
    uvicorn's entry) is loop and socket time, not the server's."""
    entry = [
        f("uvicorn/main.py", "run"),
        f("uvicorn/_compat.py", "asyncio_run"),
        "Runner.run (asyncio/runners.py:118)",
    ]
    assert stage_of(entry) == LOOP
    assert (
        stage_of([*entry[:-1], f("asyncio/base_events.py", "BaseEventLoop._run_once"), f("selectors.py")])
        == LOOP
    )
    assert stage_of([*entry, f("uvicorn/protocols/http/httptools_impl.py")]) == SERVER
    callback = f("aiohttp/client_proto.py", "ResponseHandler.data_received")
    assert stage_of([*entry, callback]) == SEND, "uvicorn's run, below the loop, is not the server stage"
    assert stage_of([*entry, f("gateway/proxy/relay.py"), callback]) == RELAY


def test_a_stack_nothing_maps_is_other() -> None:
    assert stage_of([ROOT, f("asyncio/events.py")]) == OTHER
    assert stage_of([]) == OTHER


def test_folded_stacks_are_counted_per_stage() -> None:
    text = "\n".join(
        [
            f"{ROOT};{ASGI};{HANDLE} 7",
            f'process 12:"python -m cli serve";{ROOT};{f("router/ring.py")} 2',
            f"{ROOT};{f('prometheus_client/values.py')} 1",
            "",
            "garbage line",
        ]
    )
    counts = parse_folded(text)
    assert counts == {HANDLER: 7, ROUTING: 2, METRICS: 1}
    got = shares(counts)
    assert list(got) == list(STAGES)
    assert got[HANDLER] == pytest.approx(0.7) and got[OTHER] == 0.0


UNMAPPED = {
    # start-up and configuration: built once, never on a request's path
    "gateway/fleet/alert_rules.py",
    "gateway/fleet/alert_rules_cost.py",
    "gateway/fleet/alert_rules_learned_cap.py",
    "gateway/fleet/alert_rules_promql.py",
    "gateway/composition.py",
    "gateway/fleet/shared_state_assembly.py",
    "gateway/config/disagg_settings.py",
    "gateway/config/engine_flavours.py",
    "gateway/config/engine_keys.py",
    "gateway/base/gc_tuning.py",
    "gateway/config/model_settings.py",
    "gateway/config/pool_settings.py",
    "gateway/config/settings.py",
    "gateway/config/strict_model.py",
    "gateway/config/latency_settings.py",
    "gateway/config/scrape_settings.py",
    "gateway/config/observability_settings.py",
    "gateway/config/discovery_settings.py",
    "gateway/config/slo_settings.py",
    "gateway/config/admission_settings.py",
    # helpers every stage calls: transparent, their time is the caller's
    "core/clock.py",
    "core/redaction.py",
}


def test_every_module_of_the_serve_path_has_a_stage() -> None:
    """No module of the packages the serve path runs is left to `other` by accident: the unmapped ones
    are exactly the start-up modules and the shared helpers named above."""
    unmapped = set()
    for package in ("gateway", "admission", "router", "core"):
        for path in sorted((REPO / package).rglob("*.py")):
            module = path.relative_to(REPO).as_posix()
            if path.name != "__init__.py" and not any(module.startswith(p) for p, _, _ in RULES):
                unmapped.add(module)
    assert unmapped == UNMAPPED
