"""`llm-gateway demo`: three mock engines and the gateway on 127.0.0.1, in one process tree.

The engines run as child processes (`python -m mock_engine`), the gateway in this process; Ctrl-C (or
SIGTERM) stops the gateway and then the engines.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from gateway.config.settings import parse_settings
from gateway.uvicorn_runner import serve

DEMO_MODEL = "demo-model"
ENGINE_PORTS = (8101, 8102, 8103)
GATEWAY_PORT = 8080
ENGINE_START_TIMEOUT_S = 15.0

SNIPPET = """\
Gateway ready on http://127.0.0.1:{port} with {n} mock engines ({model}).

  curl -s http://127.0.0.1:{port}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 16}}'

  .venv/bin/python - <<'PY'
  from openai import OpenAI
  client = OpenAI(base_url="http://127.0.0.1:{port}/v1", api_key="unused")
  stream = client.chat.completions.create(
      model="{model}", messages=[{{"role": "user", "content": "Hello!"}}], max_tokens=16, stream=True)
  for chunk in stream:
      print(chunk.choices[0].delta.content or "", end="", flush=True)
  print()
  PY

Metrics: http://127.0.0.1:{port}/metrics   Ctrl-C stops everything.
"""


def _wait_for_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"mock engine on port {port} did not start within {timeout_s} s")


def run_demo(gateway_port: int = GATEWAY_PORT, engine_ports: tuple[int, ...] = ENGINE_PORTS) -> int:
    engines = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mock_engine",
                "--port",
                str(port),
                "--model",
                DEMO_MODEL,
                "--first-token-delay-ms",
                "80",
                "--token-delay-ms",
                "15",
            ]
        )
        for port in engine_ports
    ]
    try:
        for port in engine_ports:
            _wait_for_port(port, ENGINE_START_TIMEOUT_S)
        settings = parse_settings(
            {
                "server": {"host": "127.0.0.1", "port": gateway_port, "drain_timeout_s": 5},
                "pools": [
                    {
                        "model": DEMO_MODEL,
                        "engine": "vllm",
                        "replicas": {"static": [f"http://127.0.0.1:{p}" for p in engine_ports]},
                        "policy": "least-load",
                    }
                ],
            }
        )
        print(SNIPPET.format(port=gateway_port, n=len(engines), model=DEMO_MODEL), flush=True)
        serve(settings, log_level="warning")
    finally:
        for engine in engines:
            engine.terminate()
        for engine in engines:
            try:
                engine.wait(timeout=5)
            except subprocess.TimeoutExpired:
                engine.kill()
    return 0
