"""CPU time of another process, from /proc (Linux).

`cpu_seconds(pid)` is utime + stime from /proc/<pid>/stat (all threads, including exited ones, in clock
ticks — 10 ms on most kernels, so divide a delta by many requests). `cpu_ns(pid)` sums the run time of
the live threads from /proc/<pid>/task/*/schedstat, in nanoseconds: precise, but blind to threads that
exited in between. Reports give both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text.rsplit(")", 1)[1].split()  # fields[0] is field 3 (state); utime is 14, stime 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ns(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total


@dataclass(frozen=True, slots=True)
class CpuReading:
    ticks_s: float
    sched_ns: int

    @classmethod
    def of(cls, pid: int) -> CpuReading:
        return cls(cpu_seconds(pid), cpu_ns(pid))

    def per_request_us(self, later: CpuReading, requests: int) -> dict[str, float | None]:
        """CPU µs per request between this reading and `later` (stat ticks and schedstat)."""
        if requests <= 0:
            return {"stat_us": None, "schedstat_us": None}
        return {
            "stat_us": (later.ticks_s - self.ticks_s) / requests * 1e6,
            "schedstat_us": (later.sched_ns - self.sched_ns) / requests / 1e3,
        }
