"""The models one mock engine serves — its base model's names and its LoRA adapters — kept as vLLM's
`OpenAIServingModels` keeps them: the `/v1/models` list, the model check of every request, and the
runtime load/unload endpoints.

- **Base model**: `names` (vLLM's `--served-model-name`; the first is the one answers carry) all
  served from `root` (vLLM's `--model`).
- **Adapters**: the static `--lora-modules name=path`, then those loaded at run time, in load order.
  Each is listed with `root` = its path and `parent` = the first base name, as vLLM lists them.
- **Model check** (`resolve`): with `checking` on, a request whose `model` is neither a base name nor a
  loaded adapter raises `UnknownModel`, answered 404 with vLLM's body `{"error": {"message": "The model
  `x` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}}`; a missing or empty
  `model` is the base model (vLLM: `_is_model_supported`). `checking` defaults to on when LoRA is
  enabled (static adapters or runtime loading) or several base names are served, else off: any name is
  then accepted and run on the base model (the mock's behaviour before adapters). vLLM always checks.
- **Runtime loading** (`runtime_loading`, vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING`): `POST
  /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"?}` and `POST /v1/unload_lora_adapter
  {"lora_name"}`, answered as vLLM does: 200 with the text `Success: LoRA adapter 'x' added
  successfully.` (`removed` for an unload); a missing or non-string field 400 (type `Bad Request`, the
  request validation error); an empty name or path 400 (`InvalidUserInput`, "Both 'lora_name' and
  'lora_path' must be provided."); loading a loaded name without `load_inplace: true` 400
  (`InvalidUserInput`, "The lora adapter 'x' has already been loaded. …"); unloading an unknown name 404
  (`NotFoundError`, "The lora adapter 'x' cannot be found."). Off, the routes do not exist (404).
- **Bound** (mock only): `max_adapters` (default None: none, as vLLM, whose `--max-cpu-loras` bounds a
  cache, not the list) refuses a load that would list more adapters: 400 `BadRequestError`.

Counters for tests (`/mock/stats`): `requests_by_model` — requests that passed the check, by the name
they asked for (a missing name counts under the first base name) — and `unknown_model_refused`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from mock_engine.text import prompt_seed

DEFAULT_LORA_ROOT = "/mock-loras"
"""Where a `--lora-modules NAME` without a path is said to live: `/mock-loras/NAME` (nothing is read)."""

Answer = tuple[int, bytes, str]
_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class LoraModule:
    """One adapter: its name (what requests ask for) and its path (its `/v1/models` root)."""

    name: str
    path: str

    @classmethod
    def parse(cls, text: str) -> LoraModule:
        """`NAME=PATH` or `NAME` (path `DEFAULT_LORA_ROOT/NAME`), as `--lora-modules` reads it;
        ValueError for an empty name or path."""
        name, sep, path = text.partition("=")
        name, path = name.strip(), path.strip()
        if not name or (sep and not path):
            raise ValueError(f"a LoRA module is NAME or NAME=PATH, got {text!r}")
        return cls(name, path or f"{DEFAULT_LORA_ROOT}/{name}")


def error_body(message: str, kind: str, status: int, param: str | None = None) -> bytes:
    """vLLM's `ErrorResponse`: `{"error": {"message", "type", "param", "code"}}`."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}})


class UnknownModel(Exception):
    """A request named a model this engine does not serve (answered 404, module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"The model `{name}` does not exist.")

    def body(self) -> bytes:
        return error_body(str(self), "NotFoundError", 404, "model")


class ServedModels:
    """Base names and adapters of one engine (module docstring)."""

    def __init__(
        self,
        names: Sequence[str],
        lora_modules: Iterable[LoraModule] = (),
        *,
        root: str | None = None,
        runtime_loading: bool = False,
        checking: bool | None = None,
        max_adapters: int | None = None,
        max_model_len: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Raises ValueError for no base name, or a duplicate base or adapter name (vLLM refuses to start
        when a static adapter fails to load)."""
        if not names or len(set(names)) != len(names):
            raise ValueError(f"base model names must be distinct and at least one, got {list(names)}")
        self.names = tuple(names)
        self.root = root or self.names[0]
        self.adapters: dict[str, LoraModule] = {}
        for module in lora_modules:
            if module.name in self.adapters:
                raise ValueError(f"The lora adapter '{module.name}' has already been loaded.")
            self.adapters[module.name] = module
        self.runtime_loading = runtime_loading
        self.lora_enabled = bool(self.adapters) or runtime_loading
        self.checking = checking if checking is not None else self.lora_enabled or len(self.names) > 1
        self.max_adapters = max_adapters
        self.max_model_len = max_model_len
        self._clock = clock
        self.requests_by_model: dict[str, int] = {}
        self.unknown_model_refused = 0

    def resolve(self, requested: str | None) -> str | None:
        """The adapter a request for `requested` (its `model` field) runs with, None for the base model;
        raises `UnknownModel` (module docstring). Counts the request."""
        if not self.checking or not requested or requested in self.names:
            adapter = None
        elif requested in self.adapters:
            adapter = requested
        else:
            self.unknown_model_refused += 1
            raise UnknownModel(requested)
        key = requested or self.names[0]
        self.requests_by_model[key] = self.requests_by_model.get(key, 0) + 1
        return adapter

    def answer_name(self, adapter: str | None) -> str:
        """The `model` of an answer: the adapter's name, else the first base name (as vLLM)."""
        return adapter if adapter is not None else self.names[0]

    def list_body(self) -> bytes:
        """`GET /v1/models`: base names first, then the adapters in load order."""
        now = int(self._clock())
        cards = [self._card(name, self.root, None, self.max_model_len, now) for name in self.names]
        cards += [self._card(m.name, m.path, self.names[0], None, now) for m in self.adapters.values()]
        return orjson.dumps({"object": "list", "data": cards})

    def _card(self, name: str, root: str, parent: str | None, max_model_len: int | None, now: int) -> Any:
        permission = {
            "id": f"modelperm-{prompt_seed(name):08x}",
            "object": "model_permission",
            "created": now,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        return {
            "id": name,
            "object": "model",
            "created": now,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": max_model_len,
            "permission": [permission],
        }

    def load(self, body: dict[str, Any]) -> Answer:
        """`POST /v1/load_lora_adapter` (module docstring): (status, body, content type)."""
        invalid = _invalid_fields(body, ("lora_name", "lora_path"), optional_flag="load_inplace")
        if invalid is not None:
            return invalid
        name, path, in_place = body["lora_name"], body["lora_path"], bool(body.get("load_inplace"))
        if not name or not path:
            message = "Both 'lora_name' and 'lora_path' must be provided."
            return 400, error_body(message, "InvalidUserInput", 400), _JSON
        if name in self.adapters and not in_place:
            message = (
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                "place, set 'load_inplace' to True."
            )
            return 400, error_body(message, "InvalidUserInput", 400), _JSON
        bound = self.max_adapters
        if name not in self.adapters and bound is not None and len(self.adapters) >= bound:
            message = (
                f"Cannot load LoRA adapter '{name}': {len(self.adapters)} adapters are loaded, the most this "
                f"engine takes (max_adapters {bound})."
            )
            return 400, error_body(message, "BadRequestError", 400), _JSON
        self.adapters[name] = LoraModule(name, path)
        return 200, f"Success: LoRA adapter '{name}' added successfully.".encode(), _TEXT

    def unload(self, body: dict[str, Any]) -> Answer:
        """`POST /v1/unload_lora_adapter` (module docstring). Requests already running keep running."""
        invalid = _invalid_fields(body, ("lora_name",))
        if invalid is not None:
            return invalid
        name = body["lora_name"]
        if not name:
            message = "'lora_name' needs to be provided to unload a LoRA adapter."
            return 400, error_body(message, "InvalidUserInput", 400), _JSON
        if name not in self.adapters:
            message = f"The lora adapter '{name}' cannot be found."
            return 404, error_body(message, "NotFoundError", 404), _JSON
        del self.adapters[name]
        return 200, f"Success: LoRA adapter '{name}' removed successfully.".encode(), _TEXT


def _invalid_fields(body: dict[str, Any], required: Sequence[str], optional_flag: str = "") -> Answer | None:
    """vLLM's request-validation 400 (type `Bad Request`) for a missing or non-string required field, or
    a non-boolean optional flag; None when the body is well formed."""
    problems = [
        f"{name}: {'Field required' if name not in body else 'Input should be a valid string'}"
        for name in required
        if not isinstance(body.get(name), str)
    ]
    if optional_flag and body.get(optional_flag) is not None and not isinstance(body[optional_flag], bool):
        problems.append(f"{optional_flag}: Input should be a valid boolean")
    if not problems:
        return None
    return 400, error_body("; ".join(problems), "Bad Request", 400), _JSON
