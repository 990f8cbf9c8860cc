"""The serve path's stages, and which one a sampled stack belongs to (`bench overhead --profile-gateway`).

A stack is a list of frames, outermost first, each `function (path:line)` as py-spy's collapsed ("raw")
format writes them; the path is the module's file, relative to its import root (py-spy's default) or
absolute (`--full-filenames`): `module_of` makes both `gateway/proxy/handler.py`.

The rule: a sample belongs to the stage of its innermost frame whose module `RULES` maps to a stage (the
longest matching prefix decides). Modules no rule names (the standard library's json, asyncio, typing,
…; pydantic; the clock) are transparent: their time is their caller's. Modules mapped *weakly* (the
aiohttp client, yarl, multidict: used by the upstream send and by the relay alike) decide only when no
frame above them maps to a stage: the relay reading a body through aiohttp is relay, aiohttp's own
connection callbacks from the event loop are the upstream client. A stack whose innermost frame is the
event loop's entry (`LOOP_LEAVES`) is time in the loop's C code and the kernel (uvloop shows no Python
frame there): its own stage; and the frames that run the loop (uvicorn's `run`, asyncio's runner) are
left out of every other stack, so a callback the loop calls directly (aiohttp's `data_received`) is
judged by its own frames. A stack no rule matches is `other` (start-up code, whatever no stage owns).

`python -m bench.profile_stages FILE.folded …` prints the shares of collapsed-stack files (those
`bench overhead --profile-gateway` keeps), so a changed mapping can be applied to a profile already
taken.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

LOOP = "event loop & socket I/O (C)"
SERVER = "server & ASGI layers"
HANDLER = "handler & parsing"
SERVE_LOOP = "serve loop (tries, legs, containment)"
ADMISSION = "admission"
ROUTING = "routing (router, registry, slots)"
SEND = "upstream send (client)"
RELAY = "relay"
METRICS = "metrics & event port"
SPANS = "spans & access log"
LOGGING = "logging"
BACKGROUND = "background loops"
OTHER = "other"

STAGES = (
    LOOP,
    SERVER,
    HANDLER,
    SERVE_LOOP,
    ADMISSION,
    ROUTING,
    SEND,
    RELAY,
    METRICS,
    SPANS,
    LOGGING,
    BACKGROUND,
    OTHER,
)

_STRONG: dict[str, tuple[str, ...]] = {
    SERVER: (
        "uvicorn/",
        "httptools/",
        "h11/",
        "starlette/",
        "fastapi/",
        "gateway/app.py",
        "gateway/uvicorn_runner.py",
        "gateway/api/connection_guard.py",
        "gateway/api/asgi_io.py",
        "gateway/api/write_deadline.py",
        "gateway/api/write_watch.py",
        "gateway/api/tcp_socket.py",
    ),
    HANDLER: (
        "gateway/proxy/handler.py",
        "gateway/proxy/error_answer.py",
        "gateway/proxy/idempotent_serving.py",
        "gateway/proxy/context.py",
        "gateway/proxy/fallback.py",
        "gateway/proxy/adapter_loading.py",
        "gateway/proxy/stores/idempotency",
        "gateway/proxy/response_affinity.py",
        "gateway/proxy/stores/response_state.py",
        "gateway/api/",
        "gateway/base/surface.py",
        "gateway/ops/",
        "gateway/upstream/model_catalog.py",
        "gateway/config/model_names.py",
        "gateway/base/errors.py",
        "gateway/base/error_mapping.py",
    ),
    SERVE_LOOP: ("gateway/proxy/", "core/tasks.py"),
    ADMISSION: (
        "admission/",
        "gateway/proxy/admit.py",
        "gateway/proxy/ring_owner_claim.py",
        "gateway/proxy/admission_assembly.py",
        "gateway/proxy/disagg/admit.py",
    ),
    ROUTING: (
        "router/",
        "core/tokens.py",
        "gateway/proxy/route.py",
        "gateway/fleet/prefix_sharing.py",
        "gateway/fleet/prefix_records.py",
        "gateway/upstream/registry.py",
        "gateway/upstream/failure_kinds.py",
        "gateway/upstream/slot",
        "gateway/upstream/replica",
        "gateway/upstream/pool.py",
        "gateway/upstream/prefill_set.py",
        "gateway/upstream/tpot_limit.py",
        "gateway/upstream/cut_check.py",
        "gateway/upstream/set_point_trim.py",
        "gateway/upstream/breaker.py",
    ),
    SEND: ("gateway/proxy/send.py", "gateway/upstream/http_client.py"),
    RELAY: (
        "gateway/proxy/relay.py",
        "gateway/proxy/sse.py",
        "gateway/proxy/reply.py",
        "core/first_token.py",
    ),
    METRICS: (
        "prometheus_client/",
        "gateway/base/metric",  # metrics.py, metric_naming.py
        "gateway/base/request_metrics.py",
        "gateway/base/dispatch_metrics.py",
        "gateway/base/replica_metrics.py",
        "gateway/proxy/admission_metrics.py",
        "gateway/fleet/autoscaling.py",
        "gateway/proxy/account.py",
        "gateway/observability/events.py",
        "gateway/observability/metric_children.py",
        "gateway/observability/observer.py",
    ),
    SPANS: ("opentelemetry/", "gateway/observability/"),
    LOGGING: ("logging/",),
    BACKGROUND: (
        "gateway/upstream/health.py",
        "gateway/upstream/scraper.py",
        "gateway/upstream/scrape_metrics.py",
        "gateway/upstream/engine_metrics/",
        "gateway/upstream/discovery/",
        "gateway/upstream/model_discovery.py",
        "gateway/upstream/pool_watchers.py",
        "gateway/fleet/instance_membership.py",
        "gateway/fleet/lowest_class_sharing.py",
        "core/shared_state.py",
        "core/state_outage.py",
    ),
}
_WEAK: dict[str, tuple[str, ...]] = {SEND: ("aiohttp/", "yarl/", "multidict/", "aiohappyeyeballs/")}

RULES: tuple[tuple[str, str, bool], ...] = tuple(
    sorted(
        [(prefix, stage, True) for stage, prefixes in _STRONG.items() for prefix in prefixes]
        + [(prefix, stage, False) for stage, prefixes in _WEAK.items() for prefix in prefixes],
        key=lambda rule: -len(rule[0]),
    )
)
"""(module path prefix, stage, strong), longest prefix first."""

_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^()]*?)(?::\d+)?\)$")
_ROOTS = re.compile(r".*/(?:site-packages|dist-packages|lib/python3\.\d+)/")
_OWN_PACKAGES = ("gateway", "admission", "router", "core", "cli", "bench", "mock_engine")


def module_of(path: str) -> str:
    """`path` relative to its import root: after site-packages or the standard library's directory, or
    from the project's own top-level package on (the last one in the path: no module of the project
    sits in a directory named like another); unchanged when it is already relative."""
    match = _ROOTS.match(path)
    if match:
        return path[match.end() :]
    if path.startswith("/"):
        parts = path.split("/")
        for i in range(len(parts) - 1, -1, -1):
            if parts[i] in _OWN_PACKAGES and i + 1 < len(parts):
                return "/".join(parts[i:])
    return path


def rule_of(module: str) -> tuple[str, bool] | None:
    """(stage, strong) of a module path, or None for a transparent module."""
    for prefix, stage, strong in RULES:
        if module.startswith(prefix):
            return stage, strong
    return None


def frame_module(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    return module_of(match.group("path")) if match else ""


LOOP_LEAVES = ("asyncio/runners.py", "selectors.py", "asyncio/base_events.py:BaseEventLoop._run_once")
"""A stack whose innermost Python frame is the loop's own (uvloop's `run_until_complete` entered from
asyncio's runner, or asyncio's `_run_once`/`select`) is time in the event loop's C code and the kernel:
socket reads and writes, polling, timers, scheduling callbacks."""


def _is_loop_leaf(frame: str) -> bool:
    module = frame_module(frame)
    function = frame.partition(" (")[0]
    return module in LOOP_LEAVES or f"{module}:{function}" in LOOP_LEAVES


def stage_of(frames: Iterable[str]) -> str:
    """The stage of one stack (frames outermost first)."""
    stack = list(frames)
    if stack and _is_loop_leaf(stack[-1]):
        return LOOP
    entries = [i for i, frame in enumerate(stack) if _is_loop_leaf(frame)]
    if entries:  # what runs the loop (uvicorn's run, asyncio's runner) is no stage of what the loop runs
        stack = stack[entries[-1] + 1 :]
    weak: str | None = None
    for frame in reversed(stack):
        rule = rule_of(frame_module(frame))
        if rule is None:
            continue
        stage, strong = rule
        if strong:
            return stage
        weak = weak or stage
    return weak or OTHER


def parse_folded(text: str) -> Counter[str]:
    """Samples per stage from collapsed stacks (`frame;frame;… count` per line)."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        counts[stage_of(frames)] += int(count)
    return counts


def shares(counts: Counter[str]) -> dict[str, float]:
    """Each stage's share of the samples, in `STAGES` order (0 for a stage with none)."""
    total = sum(counts.values())
    return {stage: (counts[stage] / total if total else 0.0) for stage in STAGES}


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.profile_stages FILE.folded …`: each file's shares per stage, one column each."""
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    columns = [shares(parse_folded(path.read_text())) for path in paths]
    print("| stage | " + " | ".join(f"{path.parent.name}/{path.name}" for path in paths) + " |")
    print("|---|" + "---|" * len(paths))
    for stage in STAGES:
        print(f"| {stage} | " + " | ".join(f"{c[stage] * 100:.1f} %" for c in columns) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
