"""A live progress line on stderr: a bar (when the run has a request count or a duration), sent/done,
rejections and errors, achieved req/s and the running TTFT p50.

On a terminal the line is redrawn in place every `interval_s`; otherwise (CI logs) a plain line is
printed every `log_interval_s`. `Progress(enabled=False)` prints nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import TextIO

from bench.sample import Sample
from bench.stats import percentile

BAR_WIDTH = 24


class Progress:
    def __init__(
        self,
        label: str,
        total_requests: int | None = None,
        *,
        duration_s: float | None = None,
        stream: TextIO | None = None,
        enabled: bool = True,
        interval_s: float = 0.5,
        log_interval_s: float = 5.0,
    ) -> None:
        self.label = label
        self.total_requests = total_requests
        self.duration_s = duration_s
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.interval_s = interval_s if self.tty else log_interval_s
        self.sent_count = 0
        self.done_count = 0
        self.rejected = 0
        self.errors = 0
        self._ttfts: list[float] = []
        self._start = time.perf_counter()
        self._task: asyncio.Task[None] | None = None

    def start(self, run_start: float) -> None:
        self._start = run_start
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._loop())

    def sent(self) -> None:
        self.sent_count += 1

    def done(self, sample: Sample) -> None:
        self.done_count += 1
        if sample.rejected:
            self.rejected += 1
        elif not sample.ok:
            self.errors += 1
        elif sample.ttft_s is not None and len(self._ttfts) < 100_000:
            self._ttfts.append(sample.ttft_s)

    def fraction(self, elapsed_s: float) -> float | None:
        if self.total_requests:
            return min(1.0, self.done_count / self.total_requests)
        if self.duration_s:
            return min(1.0, elapsed_s / self.duration_s)
        return None

    def line(self) -> str:
        elapsed_s = time.perf_counter() - self._start
        fraction = self.fraction(elapsed_s)
        bar = ""
        if fraction is not None:
            filled = int(fraction * BAR_WIDTH)
            bar = "[" + "#" * filled + "." * (BAR_WIDTH - filled) + f"] {fraction:4.0%} "
        total = f"/{self.total_requests}" if self.total_requests else ""
        rate = self.done_count / elapsed_s if elapsed_s > 0 else 0.0
        ttft = f" · TTFT p50 {percentile(self._ttfts, 50) * 1000:.0f} ms" if self._ttfts else ""
        return (
            f"{self.label} {bar}{self.done_count}{total} done · {self.sent_count - self.done_count} in flight"
            f" · {self.rejected} rejected · {self.errors} errors · {rate:.1f} req/s{ttft} · {elapsed_s:.1f} s"
        )

    def _write(self, final: bool = False) -> None:
        if self.tty:
            end = "\n" if final else ""
            self.stream.write("\r\x1b[2K" + self.line() + end)
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self._write()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
            with contextlib.suppress(Exception):
                self._write(final=True)
