"""Runs a fault schedule (`bench.faults`) against a local fleet while the load runs, and logs each event.

The schedule's clock starts at the first measured send (`start`); events run one after another in one
task, each at its offset or, when an earlier event took longer (a restart waits for the engine's
/health), as soon as that one is done — the log gives the time each really ran. `stop` (the load has
ended) cancels what is left: an event not reached is logged `skipped`, one cut short `interrupted`, so a
run always ends by itself.

- kill: `Fleet.kill_engine` (SIGKILL and reap; a few ms, on the client's loop);
- restart: `Fleet.spawn_engine` (fork/exec on the client's loop: `took` includes it), then GET /health
  every 50 ms until 200 (`ready_timeout_s`);
- set / clear: POST / DELETE `/mock/faults` on the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from bench.faults import FaultEvent

READY_POLL_S = 0.05


class FleetControl(Protocol):
    """What the runner needs of `bench.fleet.Fleet`."""

    @property
    def engine_urls(self) -> list[str]: ...

    def kill_engine(self, replica: int) -> int | None: ...

    def spawn_engine(self, replica: int) -> int: ...


@dataclass(slots=True)
class EventRecord:
    """What happened to one event. Times are seconds from the start of the measured window
    (`ran_at_s`, `ready_at_s`) and from the run's start (`origin_s` + those)."""

    event: FaultEvent
    replica_id: str
    status: str = "skipped"
    ran_at_s: float | None = None
    took_s: float | None = None
    ready_at_s: float | None = None
    detail: str = ""

    def to_json(self, origin_s: float) -> dict[str, Any]:
        return {
            **self.event.to_json(),
            "fault": self.event.describe(),
            "replica_id": self.replica_id,
            "status": self.status,
            "ran_at_s": self.ran_at_s,
            "took_s": self.took_s,
            "ready_at_s": self.ready_at_s,
            "ran_at_run_s": None if self.ran_at_s is None else origin_s + self.ran_at_s,
            "ready_at_run_s": None if self.ready_at_s is None else origin_s + self.ready_at_s,
            "detail": self.detail,
        }


class FaultRunner:
    def __init__(
        self,
        schedule: tuple[FaultEvent, ...],
        fleet: FleetControl,
        *,
        ready_timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.fleet = fleet
        self.ready_timeout_s = ready_timeout_s
        self._transport = transport
        urls = fleet.engine_urls
        self.records = [EventRecord(e, urls[e.replica].split("://", 1)[-1]) for e in schedule]
        self.origin_s = 0.0
        self._t0 = 0.0
        self._task: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None

    def start(self, origin_s: float) -> None:
        """The measured window starts now, `origin_s` after the run's start (on the running loop)."""
        if self._task is not None or not self.records:
            return
        self.origin_s = origin_s
        self._t0 = time.perf_counter()
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(5.0), transport=self._transport)
        self._task = asyncio.create_task(self._run())

    def _now_s(self) -> float:
        return time.perf_counter() - self._t0

    async def stop(self) -> list[dict[str, Any]]:
        """Cancel what is left (the load ended) and return the log."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._http is not None:
            await self._http.aclose()
        return [r.to_json(self.origin_s) for r in self.records]

    async def _run(self) -> None:
        for record in self.records:
            delay_s = record.event.at_s - self._now_s()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            record.ran_at_s = self._now_s()
            record.status = "interrupted"
            try:
                record.detail = await self._perform(record)
                record.status = "done"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one failed event is logged; the run goes on
                record.status = "failed"
                record.detail = f"{type(exc).__name__}: {exc}"
            finally:
                record.took_s = self._now_s() - record.ran_at_s

    async def _perform(self, record: EventRecord) -> str:
        event = record.event
        url = self.fleet.engine_urls[event.replica]
        if event.action == "kill":
            pid = self.fleet.kill_engine(event.replica)
            return f"SIGKILL pid {pid}" if pid is not None else "was not running"
        if event.action == "restart":
            pid = self.fleet.spawn_engine(event.replica)
            await self._wait_ready(url, event.replica)
            record.ready_at_s = self._now_s()
            waited_s = record.ready_at_s - (record.ran_at_s or 0.0)
            return f"pid {pid} on the same port, /health 200 after {waited_s:.2f} s"
        assert self._http is not None
        if event.action == "set":
            response = await self._http.post(url + "/mock/faults", json=dict(event.changes))
        else:
            response = await self._http.delete(url + "/mock/faults")
        if response.status_code != 200:
            raise RuntimeError(f"/mock/faults answered {response.status_code}: {response.text[:200]}")
        return f"/mock/faults {response.status_code}"

    async def _wait_ready(self, url: str, replica: int) -> None:
        assert self._http is not None
        deadline = time.perf_counter() + self.ready_timeout_s
        while time.perf_counter() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await self._http.get(url + "/health", timeout=0.5)).status_code == 200:
                    return
            await asyncio.sleep(READY_POLL_S)
        raise TimeoutError(f"engine {replica} not ready at {url} within {self.ready_timeout_s} s")
