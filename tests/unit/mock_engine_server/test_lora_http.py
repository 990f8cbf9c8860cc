"""Models and LoRA adapters over HTTP (uvicorn on 127.0.0.1): /v1/models, runtime load/unload, vLLM's 404
for a model not served on every endpoint that reads `model` (streamed requests answered before any
event), the answer's `model`, per-model counters, the per-adapter prefix cache and the max_loras wait as
/metrics shows them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.upstream.engine_metrics.exposition import parse_exposition
from mock_engine.core import EngineCore
from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.physics import PhysicsCore, load_profile
from mock_engine.served_models import LoraModule
from mock_engine.server import MockEngineApp, MockEngineConfig
from tests.servers import ServerThread, start_mock_engine

from .conftest import CHAT, COMPLETIONS, TIMEOUT, stats, wait_until

pytestmark = pytest.mark.timeout(60)
BASE = "base-model"
Engine = Callable[..., ServerThread]


@pytest.fixture
def engine() -> Iterator[Engine]:
    """`engine(core=..., **MockEngineConfig fields)`; `lora_modules` as "name[=path]" strings."""
    started: list[ServerThread] = []

    def factory(
        core: EngineCore | None = None, lora_modules: tuple[str, ...] = (), **config: Any
    ) -> ServerThread:
        modules = tuple(LoraModule.parse(text) for text in lora_modules)
        settings = MockEngineConfig(model=BASE, default_max_tokens=4, lora_modules=modules, **config)
        app = MockEngineApp(settings, core or FixedDelayCore(0.001, 0.001), FaultSettings())
        server = ServerThread(app, "mock-engine-lora").start()
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


def chat(url: str, model: str | None, stream: bool = False, **extra: Any) -> httpx.Response:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "stream": stream, **extra}
    if model is not None:
        body["model"] = model
    return httpx.post(url + CHAT, json=body, timeout=TIMEOUT)


def metrics(url: str, name: str) -> list[Any]:
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    return parse_exposition(text, {name}).get(name, [])


# --- /v1/models and load/unload ------------------------------------------------------------------------


def test_models_lists_the_base_model_and_each_adapter_with_its_parent(engine: Engine) -> None:
    server = engine(lora_modules=("sql=/loras/sql", "chat"), model_aliases=("alias",))
    listed = httpx.get(server.url + "/v1/models", timeout=TIMEOUT).json()
    assert [(m["id"], m["parent"], m["root"]) for m in listed["data"]] == [
        (BASE, None, BASE),
        ("alias", None, BASE),
        ("sql", BASE, "/loras/sql"),
        ("chat", BASE, "/mock-loras/chat"),
    ]
    assert all(m["object"] == "model" and "created" in m and "owned_by" in m for m in listed["data"])


def test_runtime_load_serves_the_adapter_and_unload_withdraws_it(engine: Engine) -> None:
    server = engine(allow_runtime_lora=True)
    assert chat(server.url, "sql").status_code == 404
    loaded = httpx.post(
        server.url + "/v1/load_lora_adapter",
        json={"lora_name": "sql", "lora_path": "/l/sql"},
        timeout=TIMEOUT,
    )
    assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'sql' added successfully."
    ids = [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=TIMEOUT).json()["data"]]
    assert ids == [BASE, "sql"]
    answered = chat(server.url, "sql")
    assert answered.status_code == 200 and answered.json()["model"] == "sql"
    again = httpx.post(
        server.url + "/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": "/x"}, timeout=TIMEOUT
    )
    assert again.status_code == 400 and again.json()["error"]["type"] == "InvalidUserInput"
    unloaded = httpx.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "sql"}, timeout=TIMEOUT)
    assert unloaded.status_code == 200 and "removed successfully" in unloaded.text
    assert chat(server.url, "sql").status_code == 404
    gone = httpx.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "sql"}, timeout=TIMEOUT)
    assert gone.status_code == 404 and gone.json()["error"] == {
        "message": "The lora adapter 'sql' cannot be found.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }


def test_load_with_a_bad_body_is_a_400(engine: Engine) -> None:
    server = engine(allow_runtime_lora=True)
    for content in (b"{not json", b"[1]", b'{"lora_name": "x"}'):
        answer = httpx.post(server.url + "/v1/load_lora_adapter", content=content, timeout=TIMEOUT)
        assert answer.status_code == 400, content


def test_without_runtime_loading_the_load_routes_do_not_exist(engine: Engine) -> None:
    server = engine(lora_modules=("a",))
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        answer = httpx.post(server.url + path, json={"lora_name": "b", "lora_path": "/b"}, timeout=TIMEOUT)
        assert answer.status_code == 404
    assert [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=TIMEOUT).json()["data"]] == [
        BASE,
        "a",
    ]


# --- the model check -----------------------------------------------------------------------------------

NOT_FOUND = {
    "message": "The model `nope` does not exist.",
    "type": "NotFoundError",
    "param": "model",
    "code": 404,
}
ENDPOINTS: list[tuple[str, dict[str, Any]]] = [
    (CHAT, {"messages": [{"role": "user", "content": "hi"}]}),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
    (COMPLETIONS, {"prompt": "hi"}),
    (COMPLETIONS, {"prompt": "hi", "stream": True}),
    ("/v1/embeddings", {"input": "hi"}),
    ("/tokenize", {"prompt": "hi"}),
    ("/detokenize", {"tokens": [104]}),
    ("/v1/rerank", {"query": "q", "documents": ["d"]}),
    ("/rerank", {"query": "q", "documents": ["d"]}),
    ("/v1/score", {"text_1": "a", "text_2": "b"}),
    ("/pooling", {"input": "hi"}),
    ("/classify", {"input": "hi"}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/responses", {"input": "hi", "stream": True}),
]


@pytest.fixture(scope="module")
def checked_url() -> Iterator[str]:
    server = start_mock_engine(BASE, lora_modules=["a"])
    yield server.url
    server.stop()


@pytest.mark.parametrize(("path", "body"), ENDPOINTS)
def test_a_model_not_served_is_vllms_404_on_every_endpoint(
    checked_url: str, path: str, body: dict[str, Any]
) -> None:
    before = stats(checked_url)
    answer = httpx.post(checked_url + path, json={**body, "model": "nope"}, timeout=TIMEOUT)
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"error": NOT_FOUND}
    after = stats(checked_url)
    assert after["unknown_model_refused"] == before["unknown_model_refused"] + 1
    assert after["started"] == before["started"] and after["failed_injected"] == before["failed_injected"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_messages_answers_a_model_not_served_in_anthropics_shape(checked_url: str, path: str) -> None:
    body = {"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    answer = httpx.post(checked_url + path, json=body, timeout=TIMEOUT)
    assert answer.status_code == 404
    assert answer.json() == {
        "type": "error",
        "error": {"type": "NotFoundError", "message": "The model `nope` does not exist."},
    }


@pytest.mark.parametrize(("path", "body"), ENDPOINTS)
def test_the_base_model_the_adapter_and_no_model_are_served(
    checked_url: str, path: str, body: dict[str, Any]
) -> None:
    for model in (BASE, "a", None):
        sent = body if model is None else {**body, "model": model}
        assert httpx.post(checked_url + path, json=sent, timeout=TIMEOUT).status_code == 200, model


def test_answers_carry_the_adapter_or_the_first_base_name(engine: Engine) -> None:
    server = engine(lora_modules=("a",), model_aliases=("alias",))
    assert chat(server.url, "a").json()["model"] == "a"
    assert chat(server.url, "alias").json()["model"] == BASE
    body = {"model": "a", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    with httpx.stream("POST", server.url + CHAT, json=body, timeout=TIMEOUT) as streamed:
        chunks = [orjson.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    assert chunks and {c["model"] for c in chunks} == {"a"}
    answers = [
        httpx.post(server.url + path, json={"model": "a", **fields}, timeout=TIMEOUT).json()
        for path, fields in [
            ("/v1/embeddings", {"input": "x"}),
            ("/v1/rerank", {"query": "q", "documents": ["d"]}),
            ("/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}),
            ("/v1/responses", {"input": "x"}),
        ]
    ]
    assert [answer["model"] for answer in answers] == ["a"] * 4


def test_without_adapters_any_model_name_is_accepted_as_before(engine: Engine) -> None:
    server = engine()
    answer = chat(server.url, "some-pool-name")
    assert answer.status_code == 200 and answer.json()["model"] == BASE
    assert b"lora_requests_info" not in httpx.get(server.url + "/metrics", timeout=TIMEOUT).content


def test_stats_count_requests_by_the_model_they_named(engine: Engine) -> None:
    server = engine(lora_modules=("a", "b"))
    for model in ("a", "a", "b", BASE, None, "nope"):
        chat(server.url, model)
    counted = stats(server.url)
    assert counted["requests_by_model"] == {"a": 2, "b": 1, BASE: 2}
    assert counted["unknown_model_refused"] == 1 and counted["started"] == 5


# --- physics: per-adapter prefix cache; max_loras ------------------------------------------------------


def test_the_prefix_cache_is_per_adapter(engine: Engine) -> None:
    server = engine(core=PhysicsCore(load_profile("tiny")), lora_modules=("a",), speed=20.0)
    prompt = "cached " * 60  # 420 chars: 6 full blocks of 16 tokens on the tiny profile

    def hits_after(model: str) -> float:
        answer = httpx.post(
            server.url + COMPLETIONS, json={"model": model, "prompt": prompt, "max_tokens": 1}
        )
        assert answer.status_code == 200
        return metrics(server.url, "vllm:prefix_cache_hits_total")[0].value

    assert hits_after(BASE) == 0
    assert hits_after("a") == 0  # cached under the base model: a miss for the adapter
    assert hits_after("a") == 6 * 16
    assert hits_after(BASE) == 2 * 6 * 16


def test_a_second_adapter_waits_for_the_first_and_the_lora_metric_shows_it(engine: Engine) -> None:
    server = engine(core=FixedDelayCore(0.001, 0.03), lora_modules=("a", "b"), max_loras=1)
    finished: dict[str, float] = {}
    first_token: dict[str, float] = {}

    def run(
        model: str,
    ) -> None:  # `a` runs 1.2 s: the checks below happen while it runs, even on a busy machine
        body = {"model": model, "prompt": "x", "max_tokens": 40 if model == "a" else 10, "stream": True}
        with httpx.stream("POST", server.url + COMPLETIONS, json=body, timeout=TIMEOUT) as streamed:
            for line in streamed.iter_lines():
                if line.startswith("data: {"):
                    first_token.setdefault(model, time.monotonic())
        finished[model] = time.monotonic()

    first = threading.Thread(target=run, args=("a",))
    first.start()
    assert wait_until(lambda: "a" in first_token)
    second = threading.Thread(target=run, args=("b",))
    second.start()
    assert wait_until(lambda: metrics(server.url, "vllm:num_requests_waiting")[0].value == 1)
    latest = max(metrics(server.url, "vllm:lora_requests_info"), key=lambda s: s.value)
    assert latest.labels == {"max_lora": "1", "running_lora_adapters": "a", "waiting_lora_adapters": "b"}
    assert abs(latest.value - time.time()) < 60
    first.join(10)
    second.join(10)
    assert first_token["b"] >= finished["a"] - 0.05
    latest = max(metrics(server.url, "vllm:lora_requests_info"), key=lambda s: s.value)
    assert latest.labels == {"max_lora": "1", "running_lora_adapters": "", "waiting_lora_adapters": ""}
