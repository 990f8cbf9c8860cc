"""The models a mock engine serves (base names, LoRA adapters), the model check, load/unload as vLLM answers
them, the `vllm:lora_requests_info` gauge (read back with the gateway's own exposition parser) and the CLI
flags."""

from __future__ import annotations

import argparse
from typing import Any

import orjson
import pytest

from gateway.upstream.engine_metrics.exposition import parse_exposition
from mock_engine.cli import add_arguments, build_app, runtime_lora_from_env
from mock_engine.core import EngineStats
from mock_engine.metrics_text import LORA_INFO_SERIES_KEPT, LoraRequestsInfo, render_metrics
from mock_engine.served_models import DEFAULT_LORA_ROOT, LoraModule, ServedModels, UnknownModel

NOW_S = 1_700_000_000.25


def served(*adapters: str, runtime: bool = False, **options: Any) -> ServedModels:
    modules = [LoraModule.parse(text) for text in adapters]
    return ServedModels(["base"], modules, runtime_loading=runtime, clock=lambda: NOW_S, **options)


def answer(result: tuple[int, bytes, str]) -> tuple[int, Any]:
    status, body, content_type = result
    return status, (orjson.loads(body) if content_type == "application/json" else body.decode())


# --- --lora-modules ------------------------------------------------------------------------------------


def test_lora_module_parse_reads_name_and_optional_path() -> None:
    assert LoraModule.parse("sql=/loras/sql") == LoraModule("sql", "/loras/sql")
    assert LoraModule.parse("chat") == LoraModule("chat", f"{DEFAULT_LORA_ROOT}/chat")


@pytest.mark.parametrize("text", ["", "=x", "name=", " = "])
def test_lora_module_parse_refuses_an_empty_name_or_path(text: str) -> None:
    with pytest.raises(ValueError, match="NAME or NAME=PATH"):
        LoraModule.parse(text)


def test_duplicate_names_are_refused_at_start() -> None:
    with pytest.raises(ValueError, match="already been loaded"):
        served("a", "a=/x")
    with pytest.raises(ValueError, match="distinct"):
        ServedModels(["m", "m"])


# --- the model check -----------------------------------------------------------------------------------


def test_resolve_maps_base_names_and_adapters_and_counts_requests() -> None:
    models = ServedModels(["base", "alias"], [LoraModule.parse("a")])
    assert models.checking
    assert [models.resolve(name) for name in ("base", "alias", None, "", "a", "a")] == [
        None,
        None,
        None,
        None,
        "a",
        "a",
    ]
    assert models.requests_by_model == {"base": 3, "alias": 1, "a": 2}
    assert models.answer_name(None) == "base" and models.answer_name("a") == "a"


def test_an_unknown_model_is_vllms_404() -> None:
    models = served("a")
    with pytest.raises(UnknownModel) as caught:
        models.resolve("nope")
    assert orjson.loads(caught.value.body()) == {
        "error": {
            "message": "The model `nope` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    assert models.unknown_model_refused == 1 and models.requests_by_model == {}


def test_without_adapters_any_name_runs_on_the_base_model() -> None:
    models = ServedModels(["base"])
    assert not models.checking and not models.lora_enabled
    assert models.resolve("pool-name") is None
    assert models.requests_by_model == {"pool-name": 1}


def test_checking_follows_lora_and_aliases_unless_set() -> None:
    assert served(runtime=True).checking
    assert ServedModels(["m", "n"]).checking
    assert not ServedModels(["m"], [LoraModule.parse("a")], checking=False).checking
    assert ServedModels(["m"], checking=True).checking


# --- /v1/models ----------------------------------------------------------------------------------------


def test_the_list_has_the_base_model_then_each_adapter_with_its_parent() -> None:
    models = ServedModels(
        ["base", "alias"], [LoraModule.parse("a=/loras/a")], root="/models/base", max_model_len=4096
    )
    cards = orjson.loads(models.list_body())
    assert cards["object"] == "list"
    summary = [(c["id"], c["root"], c["parent"], c["max_model_len"]) for c in cards["data"]]
    assert summary == [
        ("base", "/models/base", None, 4096),
        ("alias", "/models/base", None, 4096),
        ("a", "/loras/a", "base", None),
    ]
    for card in cards["data"]:
        assert card["object"] == "model" and card["owned_by"] == "vllm"
        assert isinstance(card["created"], int)
        assert card["permission"][0]["object"] == "model_permission"


# --- load / unload -------------------------------------------------------------------------------------


def test_load_then_unload() -> None:
    models = served(runtime=True)
    assert answer(models.load({"lora_name": "sql", "lora_path": "/l/sql"})) == (
        200,
        "Success: LoRA adapter 'sql' added successfully.",
    )
    assert models.resolve("sql") == "sql"
    assert [c["id"] for c in orjson.loads(models.list_body())["data"]] == ["base", "sql"]
    assert answer(models.unload({"lora_name": "sql"})) == (
        200,
        "Success: LoRA adapter 'sql' removed successfully.",
    )
    with pytest.raises(UnknownModel):
        models.resolve("sql")


def _error(result: tuple[int, bytes, str]) -> tuple[int, str, str]:
    status, body = answer(result)
    return status, body["error"]["type"], body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "kind", "words"),
    [
        ({"lora_path": "/p"}, "Bad Request", "lora_name: Field required"),
        ({"lora_name": "x"}, "Bad Request", "lora_path: Field required"),
        ({"lora_name": 3, "lora_path": "/p"}, "Bad Request", "lora_name: Input should be a valid string"),
        ({"lora_name": "x", "lora_path": "/p", "load_inplace": "yes"}, "Bad Request", "valid boolean"),
        ({"lora_name": "", "lora_path": "/p"}, "InvalidUserInput", "Both 'lora_name' and 'lora_path'"),
        ({"lora_name": "a", "lora_path": "/p"}, "InvalidUserInput", "'a' has already been loaded"),
    ],
)
def test_load_errors_are_vllms_400s(body: dict[str, Any], kind: str, words: str) -> None:
    status, error_type, message = _error(served("a", runtime=True).load(body))
    assert (status, error_type) == (400, kind) and words in message


def test_load_inplace_replaces_the_path() -> None:
    models = served("a=/old", runtime=True)
    status, _ = answer(models.load({"lora_name": "a", "lora_path": "/new", "load_inplace": True}))
    assert status == 200 and models.adapters["a"].path == "/new"


def test_the_mock_bound_on_adapters_refuses_a_load_past_it() -> None:
    models = served("a", runtime=True, max_adapters=1)
    status, error_type, message = _error(models.load({"lora_name": "b", "lora_path": "/b"}))
    assert (status, error_type) == (400, "BadRequestError") and "max_adapters 1" in message
    assert answer(models.load({"lora_name": "a", "lora_path": "/a2", "load_inplace": True}))[0] == 200


@pytest.mark.parametrize(
    ("body", "status", "kind", "words"),
    [
        ({}, 400, "Bad Request", "lora_name: Field required"),
        ({"lora_name": ""}, 400, "InvalidUserInput", "'lora_name' needs to be provided"),
        ({"lora_name": "ghost"}, 404, "NotFoundError", "The lora adapter 'ghost' cannot be found."),
    ],
)
def test_unload_errors(body: dict[str, Any], status: int, kind: str, words: str) -> None:
    got_status, error_type, message = _error(served("a", runtime=True).unload(body))
    assert (got_status, error_type) == (status, kind) and words in message


# --- vllm:lora_requests_info ---------------------------------------------------------------------------


def _stats(running: tuple[str, ...] = (), waiting: tuple[str, ...] = ()) -> EngineStats:
    return EngineStats(2, 1, 0.0, 0, 0, 0, 0, 0, running_adapters=running, waiting_adapters=waiting)


def test_lora_info_is_one_series_per_label_set_valued_at_the_time_it_was_last_current() -> None:
    info = LoraRequestsInfo(max_loras=2)
    info.sample(_stats(("a",), ("b", "c")), NOW_S)
    info.sample(_stats(("a", "b"), ()), NOW_S + 5)
    text = render_metrics("base", _stats(), lora=info).decode()
    assert "# TYPE vllm:lora_requests_info gauge" in text
    assert (
        'vllm:lora_requests_info{max_lora="2",waiting_lora_adapters="b,c",running_lora_adapters="a"} '
        "1.70000000025e+09"
    ) in text
    samples = parse_exposition(text, {"vllm:lora_requests_info"})["vllm:lora_requests_info"]
    latest = max(samples, key=lambda s: s.value)
    assert latest.labels == {"max_lora": "2", "waiting_lora_adapters": "", "running_lora_adapters": "a,b"}
    assert latest.value == pytest.approx(NOW_S + 5)
    assert len(samples) == 2


def test_lora_info_keeps_a_bounded_number_of_series_dropping_the_oldest() -> None:
    info = LoraRequestsInfo(max_loras=1)
    for i in range(LORA_INFO_SERIES_KEPT + 3):
        info.sample(_stats((f"a{i}",)), NOW_S + i)
    series = [line for line in info.lines() if not line.startswith("#")]
    assert len(series) == LORA_INFO_SERIES_KEPT
    assert not any('running_lora_adapters="a0"' in line for line in series)


def test_lora_info_is_only_in_the_vllm_flavour() -> None:
    info = LoraRequestsInfo(max_loras=1)
    info.sample(_stats(), NOW_S)
    assert b"lora_requests_info" not in render_metrics("m", _stats(), flavour="sglang", lora=info)
    assert b"lora_requests_info" not in render_metrics("m", _stats())


# --- CLI -----------------------------------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_builds_the_served_models() -> None:
    args = _args(
        "--model",
        "/models/llama",
        "--served-model-name",
        "llama",
        "llama-alias",
        "--lora-modules",
        "sql=/loras/sql",
        "chat",
        "--lora-modules",
        "math",
        "--max-loras",
        "2",
        "--allow-runtime-lora",
        "--max-adapters",
        "8",
    )
    app = build_app(args)
    models = app.models
    assert models.names == ("llama", "llama-alias") and models.root == "/models/llama"
    assert list(models.adapters) == ["sql", "chat", "math"]
    assert models.runtime_loading and models.checking and models.max_adapters == 8
    assert app.driver.core.max_loras == 2 and app.lora_info is not None


def test_cli_defaults_keep_the_old_behaviour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    app = build_app(_args("--model", "m"))
    assert app.models.names == ("m",) and not app.models.checking and app.lora_info is None
    assert app.driver.core.max_loras == 1


@pytest.mark.parametrize("argv", [["--max-loras", "0"], ["--lora-modules", "x="], ["--max-adapters", "0"]])
def test_cli_refuses_bad_model_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        _args(*argv)
    assert caught.value.code == 2


@pytest.mark.parametrize(
    ("value", "on"), [("1", True), ("true", True), (" TRUE ", True), ("0", False), ("yes", False)]
)
def test_runtime_loading_follows_vllms_environment_variable(value: str, on: bool) -> None:
    assert runtime_lora_from_env({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": value}) is on
    assert runtime_lora_from_env({}) is False
