"""CPU per request of each part of a gateway's process tree, for `bench.workers_throughput`.

Roles: `supervisor` (the process started; with one worker it is the server itself: `workers`), `workers`
(its other children: the worker processes, and multiprocessing's resource tracker, idle), `state server`
(a child running `valkey-server`: the local state server) and `redis` (an outside process whose CPU
counts with the gateway's, `--redis-pid`). Each role's CPU is schedstat's (ns, live threads), so the
roles add up to the schedstat column, not to the stat ticks.

`RoleLedger.read` is `interleaved_blocks`' `cpu_of`: it returns the CPU of the whole tree (and of the
outside process) summed, and keeps each role's; a target's readings come in pairs (before and after
each of its blocks).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from bench.cpu_per_request import Target
from bench.proc import CpuReading

ROLES = ("supervisor", "workers", "state server", "redis")


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def role_of(pid: int, root: int, has_children: bool) -> str:
    """The role of `pid` in the tree rooted at `root` (module docstring)."""
    if pid == root:
        return "supervisor" if has_children else "workers"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()  # valkey-server rewrites its own title
    except OSError:
        return "workers"
    return "state server" if b"valkey-server" in command else "workers"


class RoleLedger:
    """Per target and role, the CPU ns of its measured blocks (module docstring)."""

    def __init__(self, also: Mapping[str, int]) -> None:
        """`also`: per target name, an outside process counted as `redis`."""
        self._also = dict(also)
        self._before: dict[str, dict[str, int]] = {}
        self.ns: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(ROLES, 0))

    def read(self, target: Target) -> CpuReading:
        kids = children(target.pid)
        by_role = dict.fromkeys(ROLES, 0)
        ticks_s = 0.0
        for pid in [target.pid, *kids]:
            reading = CpuReading.of(pid)
            ticks_s += reading.ticks_s
            by_role[role_of(pid, target.pid, bool(kids))] += reading.sched_ns
        if (outside := self._also.get(target.name)) is not None:
            reading = CpuReading.of(outside)
            ticks_s += reading.ticks_s
            by_role["redis"] += reading.sched_ns
        before = self._before.pop(target.name, None)
        if before is None:
            self._before[target.name] = by_role
        else:
            for role in ROLES:
                self.ns[target.name][role] += by_role[role] - before[role]
        return CpuReading(ticks_s, sum(by_role.values()))

    def render(self, requests: Mapping[str, int]) -> str:
        """A markdown table: µs per request of each role (schedstat), per target."""
        lines = ["| gateway | " + " | ".join(ROLES) + " |", "|---|" + "---|" * len(ROLES)]
        for name, ns in self.ns.items():
            cells = " | ".join(f"{ns[role] / requests[name] / 1e3:.0f}" for role in ROLES)
            lines.append(f"| {name} | {cells} |")
        return "\n".join(lines) + "\n"
