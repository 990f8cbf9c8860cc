"""Where the gateway's CPU goes under load: py-spy samples the gateway process during a closed-loop block
(`bench overhead --profile-gateway FILE`), and each sampled stack is given to a serve-path stage
(bench/profile_stages.py).

py-spy (`pip install py-spy`, in the `dev` extra) is looked for beside this interpreter, then on PATH; it
attaches to the gateway's pid, which needs ptrace permission (root, or `kernel.yama.ptrace_scope` 0). It
samples at `RATE_HZ`, pausing the process for each sample, so a profiled block's latency and req/s are
not the gateway's: the profiled blocks come after the measured phases, and only the shares are read from
them. Idle samples (the loop waiting in epoll) are not recorded, so the shares are of the CPU the gateway
used, all threads together.

FILE gets the breakdown (markdown: one column per kind of request, each stage's share of the samples,
and the command); `FILE.<kind>.folded` the collapsed stacks (flamegraph.pl's input), to look deeper.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.arrivals import ClosedLoop
from bench.client import Client
from bench.profile_stages import STAGES, parse_folded, shares
from bench.runner import LoadPlan, run_load
from bench.workload import RequestSpec

RATE_HZ = 250
ATTACH_S = 1.0
"""Load starts this long after py-spy, so its first samples see the load."""


class ProfilerMissing(RuntimeError):
    """py-spy is not installed."""


def py_spy() -> str:
    """The py-spy executable: beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise ProfilerMissing("py-spy not found: pip install py-spy (it is in the dev extra)")
    return found


async def sampled(pid: int, folded: Path, load: Callable[[], Any]) -> str:
    """Run `await load()` while py-spy records `pid` into `folded`; the collapsed stacks' text."""
    argv = ["record", "--pid", str(pid), "--rate", str(RATE_HZ), "--format", "raw", "--output", str(folded)]
    proc = await asyncio.create_subprocess_exec(
        py_spy(),
        *argv,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        await asyncio.sleep(ATTACH_S)
        if proc.returncode is not None:
            raise RuntimeError(f"py-spy exited with {proc.returncode}")
        await load()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    text = await asyncio.to_thread(_read, folded)
    if text is None:
        raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')}")
    return text


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


async def profile_blocks(
    out: Path,
    pid: int,
    url: str,
    kinds: dict[str, tuple[Client, RequestSpec]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """For each kind (name → client and request), one closed-loop block of `args.profile_s` at
    `args.throughput_concurrency` through `url`, sampled; the breakdown is written to `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    plan = LoadPlan(ClosedLoop(args.throughput_concurrency), duration_s=args.profile_s)
    result: dict[str, Any] = {"concurrency": args.throughput_concurrency, "seconds": args.profile_s}
    for kind, (client, spec) in kinds.items():
        folded = out.with_name(f"{out.name}.{kind}.folded")

        async def load(client: Client = client, spec: RequestSpec = spec) -> None:
            await run_load(plan, itertools.repeat(spec), client, lambda _spec: url)

        counts = parse_folded(await sampled(pid, folded, load))
        result[kind] = {"samples": sum(counts.values()), "shares": shares(counts), "folded": str(folded)}
    await asyncio.to_thread(out.write_text, render_profile(result, sys.argv))
    return result


def render_profile(result: dict[str, Any], argv: list[str]) -> str:
    """The breakdown as markdown: stage × kind, shares in percent."""
    kinds = [k for k in result if isinstance(result[k], dict) and "shares" in result[k]]
    lines = [
        f"Gateway CPU by serve-path stage: py-spy samples at {RATE_HZ} Hz over one closed-loop block of "
        f"{result.get('seconds')} s per kind at concurrency {result.get('concurrency')} (share of the "
        "gateway's non-idle samples; stages: bench/profile_stages.py).",
        "",
        "| stage | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for stage in STAGES:
        cells = [f"{result[k]['shares'][stage] * 100:.1f} %" for k in kinds]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines.append("| samples | " + " | ".join(str(result[k]["samples"]) for k in kinds) + " |")
    tail = argv[argv.index("overhead") + 1 :] if "overhead" in argv else []
    command = " ".join(["llm-gateway", "bench", "overhead", *tail])
    lines += ["", f"Command: `{command}`"]
    return "\n".join(lines) + "\n"
