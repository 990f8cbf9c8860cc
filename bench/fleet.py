"""A local fleet the benchmark starts and stops itself: N mock-engine replicas and (optionally) the gateway,
each a child process on 127.0.0.1.

- Several gateway instances (`gateways=K`, default 1, or the entry's `GatewayOptions.instances`): K
  gateway processes with the same config (each on its own port) in front of the same engines, sharing
  what the config's own `state` section shares, as in production (`settings_overrides` can set it:
  `state: {backend: redis}`). With Redis state each fleet's gateways get a fresh `key_prefix` unless the
  config names one, so no entry sees the state of the one before. The load generator spreads requests
  over `gateway_urls`.
- Ports are chosen free (`bench.listen_ports`: below the kernel's ephemeral range, so no readiness
  poll's connection takes one before the child binds it) unless `base_port` is given: then
  gateway instance j listens on `base_port + j` and engine i on `base_port + K + i` (one gateway: the
  gateway on `base_port`, engine i on `base_port + 1 + i`).
- Engines and gateways run what `bench.fleet_config` describes: the engines' flags (`EngineOptions`,
  with their roles in a disaggregated fleet) and the gateway's generated config (`gateway_config`).
- Pinning: with `Pinning(gateway_cpu=0, others_cpu=1)` the gateway (every instance) runs under
  `taskset -c 0`, the engines
  under `taskset -c 1` (the caller pins itself, the client, with `pin_self`).
- Fault schedules (`bench.fault_runner`) kill an engine (`kill_engine`: SIGKILL, as a crash) and start it
  again on the same port with the same command (`spawn_engine`; its log goes to `engine-<i>.<n>.log`).
- Everything is stopped on exit, including Ctrl-C and exceptions (the `with` block), and if the benchmark
  process itself is killed: children get SIGTERM from the kernel when their parent dies (PR_SET_PDEATHSIG).
  Children run in their own session, so Ctrl-C reaches only the benchmark, which stops them in order
  (SIGTERM, then SIGKILL after `stop_timeout_s`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.fleet_config import EngineOptions, GatewayOptions, gateway_config
from bench.listen_ports import free_port

READY_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class Pinning:
    gateway_cpu: int | None = None
    others_cpu: int | None = None


def pin_self(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Fleet:
    """`with Fleet(...) as fleet:` — started on enter, stopped on exit (whatever happened)."""

    def __init__(
        self,
        replicas: int,
        engine: EngineOptions,
        gateway: GatewayOptions | None = GatewayOptions(),
        *,
        pinning: Pinning = Pinning(),
        base_port: int | None = None,
        log_dir: Path | None = None,
        stop_timeout_s: float = 5.0,
        gateways: int = 1,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        if gateway is not None and gateway.instances is not None:
            gateways = gateway.instances
        if gateways < 1:
            raise ValueError(f"gateway instances must be >= 1, got {gateways}")
        self.disagg = gateway.disagg if gateway is not None else None
        if self.disagg is not None and self.disagg.replicas != replicas:
            shape = f"{self.disagg.prefill}:{self.disagg.decode}"
            raise ValueError(f"a {shape} fleet has {self.disagg.replicas} engines, not {replicas}")
        self.engine = engine
        self.gateway = gateway
        self.pinning = pinning
        self.stop_timeout_s = stop_timeout_s
        self._log_dir = log_dir or Path(tempfile.mkdtemp(prefix="llm-gateway-bench-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self.gateway_ports = [
            base_port + j if base_port is not None else free_port() for j in range(gateways)
        ]
        self.gateway_port = self.gateway_ports[0]
        self.engine_ports = [
            base_port + gateways + i if base_port is not None else free_port() for i in range(replicas)
        ]
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._restarts: dict[int, int] = {}
        self.gateway_pids: list[int] = []
        self.state_key_prefix = f"llm-gateway-bench:{uuid.uuid4().hex[:12]}:"
        """Redis keys of this fleet's gateways (Redis state only): a fresh fleet shares nothing with
        the previous entry's (its prefix index, slot leases, membership)."""

    @property
    def gateway_pid(self) -> int | None:
        """The first gateway instance's pid (the only one unless `gateways` > 1)."""
        return self.gateway_pids[0] if self.gateway_pids else None

    def gateway_name(self, instance: int) -> str:
        """Process (and log) name of gateway instance `instance`: `gateway`, or `gateway-<j>` when several."""
        return "gateway" if len(self.gateway_ports) == 1 else f"gateway-{instance}"

    @property
    def engine_pids(self) -> list[int]:
        return [proc.pid for name, proc in self._procs if name.startswith("engine-")]

    @property
    def engine_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.engine_ports]

    @property
    def engines(self) -> dict[str, str]:
        """replica id (`host:port`, as in `x-gateway-replica`) → URL."""
        return {f"127.0.0.1:{p}": f"http://127.0.0.1:{p}" for p in self.engine_ports}

    @property
    def answering_engines(self) -> list[str]:
        """Replica ids of the engines that answer clients (`x-gateway-replica`): all of them, or the
        decode engines of a disaggregated fleet."""
        first = self.disagg.prefill if self.disagg is not None else 0
        return list(self.engines)[first:]

    @property
    def gateway_url(self) -> str | None:
        return f"http://127.0.0.1:{self.gateway_port}" if self.gateway is not None else None

    @property
    def gateway_urls(self) -> list[str]:
        """Every gateway instance's URL (empty without a gateway)."""
        return [f"http://127.0.0.1:{p}" for p in self.gateway_ports] if self.gateway is not None else []

    @property
    def url(self) -> str:
        """Where clients send: the gateway, or the only engine when there is no gateway."""
        return self.gateway_url or self.engine_urls[0]

    def __enter__(self) -> Fleet:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for i in range(len(self.engine_ports)):
            self._spawn(f"engine-{i}", self._engine_argv(i), self.pinning.others_cpu)
        for i, url in enumerate(self.engine_urls):
            self._wait_ready(f"engine-{i}", url + "/health")
        if self.gateway is None:
            return
        for j, port in enumerate(self.gateway_ports):
            name = self.gateway_name(j)
            config = gateway_config(
                self.gateway, self.engine.model, self.engine_urls, port, self.state_key_prefix
            )
            config_path = self._log_dir / f"{name}.yaml"
            config_path.write_text(json.dumps(config, indent=2))  # JSON is YAML
            argv = [sys.executable, "-m", "cli", "serve", "--config", str(config_path)]
            proc = self._spawn(name, [*argv, "--log-level", self.gateway.log_level], self.pinning.gateway_cpu)
            self.gateway_pids.append(proc.pid)
        for j, url in enumerate(self.gateway_urls):
            self._wait_ready(self.gateway_name(j), f"{url}/readyz")

    def _engine_argv(self, replica: int) -> list[str]:
        """Engine `replica`'s command: the common flags, then its role's in a disaggregated fleet."""
        roles = self.disagg.engine_args(replica) if self.disagg is not None else []
        return [sys.executable, *self.engine.argv(self.engine_ports[replica], replica), *roles]

    def _engine(self, replica: int) -> tuple[int, subprocess.Popen[bytes]]:
        name = f"engine-{replica}"
        for index, (proc_name, proc) in enumerate(self._procs):
            if proc_name == name:
                return index, proc
        raise ValueError(f"no engine {replica} in this fleet")

    def kill_engine(self, replica: int) -> int | None:
        """SIGKILL engine `replica` and reap it (its connections are closed by the kernel, its port
        refuses); its pid, or None when it was not running."""
        _, proc = self._engine(replica)
        if proc.poll() is not None:
            return None
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=self.stop_timeout_s)
        return proc.pid

    def spawn_engine(self, replica: int) -> int:
        """Start engine `replica` again (killed first if it still runs) with the same command on the same
        port; returns the new pid without waiting for it to be ready (poll its /health)."""
        self.kill_engine(replica)
        index, _ = self._engine(replica)
        self._restarts[replica] = self._restarts.get(replica, 0) + 1
        name = f"engine-{replica}"
        log_name = f"{name}.{self._restarts[replica]}"
        proc = self._spawn(name, self._engine_argv(replica), self.pinning.others_cpu, log_name=log_name)
        self._procs.pop()
        self._procs[index] = (name, proc)
        return proc.pid

    def _spawn(
        self, name: str, argv: list[str], cpu: int | None, log_name: str | None = None
    ) -> subprocess.Popen[bytes]:
        prefix = ["taskset", "-c", str(cpu)] if cpu is not None else []
        log = (self._log_dir / f"{log_name or name}.log").open("wb")
        proc = subprocess.Popen(
            [*prefix, *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a prctl, no locks
        )
        log.close()
        self._procs.append((name, proc))
        return proc

    def _wait_ready(self, name: str, url: str) -> None:
        proc = dict(self._procs)[name]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=0.5).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"{name} not ready at {url} within {READY_TIMEOUT_S} s:\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self._log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to every child (gateways first), then SIGKILL whatever is left after the timeout."""
        procs = list(reversed(self._procs))
        for _, proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for _, proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        self.gateway_pids = []
