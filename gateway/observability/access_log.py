"""The structured access log: one JSON line per request on the `llm_gateway.access` logger.

`AccessLog.write(fields, ...)` decides whether the line is kept and hands it to the logger:
- always kept: any outcome but `success` (rejections, upstream failures, client disconnects), and slow
  requests — duration ≥ `slow_request_ms`, or TTFT ≥ `slow_ttft_ms` (default: the pool's `slo.ttft_s`);
- otherwise kept when `rng.random() < sample_ratio` (the rng is injected: seeded in tests).

The line is serialised on the event loop (orjson, a few µs) and written by a `QueueListener` thread, so a
slow stdout (a full pipe to a log collector) never blocks requests. `start()` attaches the handler
(unless `stream: none`) and starts the thread; `stop()` drains the queue and detaches. The fields are
the table of docs/OPERATIONS.md ("Access log"); `fields` never holds prompt or completion text or an
API key — its builder (`gateway.observability.request_record`) reads only names, counts and timings.
"""

from __future__ import annotations

import logging
import queue
import random
import sys
from logging.handlers import QueueHandler, QueueListener
from typing import Any

import orjson

from gateway.config.observability_settings import AccessLogSettings

ACCESS_LOGGER = "llm_gateway.access"
OUTCOME_SUCCESS = "success"


class AccessLog:
    """Sampling and writing of access-log lines (see the module docstring)."""

    def __init__(self, settings: AccessLogSettings, rng: random.Random) -> None:
        self._settings = settings
        self._rng = rng
        self.logger = logging.getLogger(ACCESS_LOGGER)
        self._queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self._listener: QueueListener | None = None
        self._handler: QueueHandler | None = None

    def start(self) -> None:
        """Attach the queue handler and start the writer thread (nothing to attach with `stream: none`)."""
        self.logger.setLevel(logging.INFO)
        if self._settings.stream == "none" or self._handler is not None:
            return
        out = logging.StreamHandler(sys.stdout if self._settings.stream == "stdout" else sys.stderr)
        out.setFormatter(logging.Formatter("%(message)s"))
        self._listener = QueueListener(self._queue, out)
        self._listener.start()
        self._handler = QueueHandler(self._queue)
        self.logger.addHandler(self._handler)
        self.logger.propagate = False

    async def stop(self) -> None:
        """Detach and write what is still queued (idempotent)."""
        if self._handler is not None:
            self.logger.removeHandler(self._handler)
            self.logger.propagate = True
            self._handler = None
        if self._listener is not None:
            self._listener.stop()
            self._listener = None

    def keeps(
        self, outcome: str, duration_ms: float, ttft_ms: float | None, slo_ttft_ms: float | None
    ) -> bool:
        """Whether a request's line is written (module docstring)."""
        if outcome != OUTCOME_SUCCESS:
            return True
        s = self._settings
        if s.slow_request_ms is not None and duration_ms >= s.slow_request_ms:
            return True
        slow_ttft_ms = s.slow_ttft_ms if s.slow_ttft_ms is not None else slo_ttft_ms
        if ttft_ms is not None and slow_ttft_ms is not None and ttft_ms >= slow_ttft_ms:
            return True
        return s.sample_ratio >= 1.0 or self._rng.random() < s.sample_ratio

    def write(self, fields: dict[str, Any]) -> None:
        """Log one line (the caller decided to keep it)."""
        self.logger.info(orjson.dumps(fields).decode())
