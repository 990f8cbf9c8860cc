"""The Responses API routes of the mock engine and its in-memory response store, as vLLM keeps it.

- `POST /v1/responses`: create (streamed or not; format in `responses_format.py`); a `model` the engine
  does not serve is vLLM's 404 (`served_models.py`), checked first as vLLM does. With
  `previous_response_id`, the conversation continues the stored one; an id this engine never stored is a
  404 (`{"error": {"message": "Response with id '…' not found.", "type": "invalid_request_error",
  "param": "previous_response_id", "code": 404}}`, vLLM's answer) — so a gateway that sends a chained
  request to another replica fails visibly. `store: false` keeps nothing.
- `GET /v1/responses/{id}`: the stored object; `DELETE /v1/responses/{id}`: `{"id", "object":
  "response", "deleted": true}`; `POST /v1/responses/{id}/cancel`: 400 "Cannot cancel a synchronous
  response." (the mock has no background responses); `GET /v1/responses/{id}/input_items`: OpenAI's
  list shape (`{"object": "list", "data", "first_id", "last_id", "has_more": false}`) of the
  conversation's messages before the response's output. Each an unknown id: 404 as above (`param` null).

The store holds at most `MAX_STORED` responses (the oldest dropped first), in this process's memory: a
restarted engine has lost them, as vLLM's. `ResponseStore.served` counts the calls each stored id
answered (tests read it through `/mock/stats` as `responses_stored`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from mock_engine import openai_format as fmt
from mock_engine.asgi import Receive, Scope, Send, respond
from mock_engine.responses_format import Message, ResponsesWire, generation, input_messages
from mock_engine.served_models import UnknownModel
from mock_engine.validation import RequestError, common_fields

if TYPE_CHECKING:
    from mock_engine.server import Handler, MockEngineApp

RESPONSES_PATH = "/v1/responses"
MAX_STORED = 10_000


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response: its object and the conversation it ends (its output included)."""

    obj: dict[str, Any]
    conversation: list[Message]


class ResponseStore:
    """Response id → stored response, bounded (module docstring)."""

    def __init__(self, max_stored: int = MAX_STORED) -> None:
        self._max_stored = max_stored
        self._stored: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._stored)

    def get(self, response_id: str) -> StoredResponse | None:
        return self._stored.get(response_id)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._stored[response_id] = stored
        while len(self._stored) > self._max_stored:
            self._stored.popitem(last=False)

    def delete(self, response_id: str) -> bool:
        return self._stored.pop(response_id, None) is not None


def not_found_body(response_id: str, param: str | None = None) -> bytes:
    """vLLM's answer for a response id it does not hold (404)."""
    error = {
        "message": f"Response with id '{response_id}' not found.",
        "type": "invalid_request_error",
        "param": param,
        "code": 404,
    }
    return orjson.dumps({"error": error})


class ResponsesApi:
    """The routes (module docstring) over one engine's store."""

    def __init__(self, app: MockEngineApp) -> None:
        self._app = app
        self.store = ResponseStore()

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {("POST", RESPONSES_PATH): self._create}

    def match(self, method: str, path: str) -> Handler | None:
        """The handler of a `/v1/responses/{id}[/cancel|/input_items]` call, or None."""
        if not path.startswith(RESPONSES_PATH + "/"):
            return None
        parts = path[len(RESPONSES_PATH) + 1 :].split("/")
        if len(parts) == 1 and method == "GET":
            return self._retrieve
        if len(parts) == 1 and method == "DELETE":
            return self._delete
        if len(parts) == 2 and parts[1] == "cancel" and method == "POST":
            return self._cancel
        if len(parts) == 2 and parts[1] == "input_items" and method == "GET":
            return self._input_items
        return None

    async def _create(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self._app
        body = await app.read_json(receive, send)
        if body is None:
            return
        try:
            common_fields(body)
            adapter = app.models.resolve(body.get("model"))
        except RequestError as exc:
            await respond(send, 400, fmt.bad_request_body(str(exc), exc.param))
            return
        except UnknownModel as exc:
            await respond(send, 404, exc.body())
            return
        previous_id = body.get("previous_response_id")
        previous = None if previous_id is None else self.store.get(str(previous_id))
        if previous_id is not None and previous is None:
            await respond(send, 404, not_found_body(str(previous_id), "previous_response_id"))
            return
        try:
            conversation = [*(previous.conversation if previous else []), *input_messages(body)]
            gen = dataclasses.replace(
                generation(body, conversation, app.config.default_max_tokens), adapter=adapter
            )
        except RequestError as exc:
            await respond(send, 400, fmt.bad_request_body(str(exc), exc.param))
            return
        too_long = app.over_context(gen)
        if too_long is not None:
            await respond(send, 400, fmt.bad_request_body(too_long))
            return
        plan = await app.fault_plan(send, gen.prompt)
        if plan is None:
            return
        response_id = "resp_" + uuid.uuid4().hex
        store = body.get("store") is not False

        def keep(obj: dict[str, Any], text: str) -> None:
            if store:
                reply = {"role": "assistant", "content": text}
                self.store.put(response_id, StoredResponse(obj, [*conversation, reply]))

        wire = ResponsesWire(response_id, app.models.answer_name(adapter), gen, body, keep)
        await app.runner.run(gen, plan, receive, send, stream=bool(body.get("stream")), wire=wire)

    def _id(self, scope: Scope) -> str:
        return str(scope["path"][len(RESPONSES_PATH) + 1 :].split("/")[0])

    async def _retrieve(self, scope: Scope, receive: Receive, send: Send) -> None:
        stored = self.store.get(self._id(scope))
        if stored is None:
            await respond(send, 404, not_found_body(self._id(scope)))
            return
        await respond(send, 200, orjson.dumps(stored.obj))

    async def _delete(self, scope: Scope, receive: Receive, send: Send) -> None:
        response_id = self._id(scope)
        if not self.store.delete(response_id):
            await respond(send, 404, not_found_body(response_id))
            return
        await respond(send, 200, orjson.dumps({"id": response_id, "object": "response", "deleted": True}))

    async def _input_items(self, scope: Scope, receive: Receive, send: Send) -> None:
        response_id = self._id(scope)
        stored = self.store.get(response_id)
        if stored is None:
            await respond(send, 404, not_found_body(response_id))
            return
        items = [
            {
                "id": f"msg_{response_id}_{i}",
                "type": "message",
                "role": message["role"],
                "content": [{"type": "input_text", "text": message["content"]}],
            }
            for i, message in enumerate(stored.conversation[:-1])
        ]
        first, last = (items[0]["id"], items[-1]["id"]) if items else (None, None)
        listing = {"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": False}
        await respond(send, 200, orjson.dumps(listing))

    async def _cancel(self, scope: Scope, receive: Receive, send: Send) -> None:
        response_id = self._id(scope)
        if self.store.get(response_id) is None:
            await respond(send, 404, not_found_body(response_id))
            return
        error = {
            "message": "Cannot cancel a synchronous response.",
            "type": "invalid_request_error",
            "param": None,
            "code": 400,
        }
        await respond(send, 400, orjson.dumps({"error": error}))
