"""Hypothesis strategies for hostile and careless requests: bodies whose every field the gateway reads
may be missing, of a wrong type, huge, nested or unicode; bodies that are no JSON object or no JSON at
all; header values of every shape h11 lets a client send.

Bodies start from a valid request and change a few fields, so a good share of them is valid and reaches
the engines (the rest is refused by the gateway, or by the engine with its own 400). Nesting stays
shallow here (a few levels; prompt fields up to 20, across the gateway's limit of 16): the very deep
bodies are their own tests (`test_request_fuzz.py::test_deeply_nested_bodies`).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from gateway.api.request_parsing import Endpoint
from tests.fuzz.fleet import MAX_BODY_BYTES, MODEL, REWRITE

STORED_MARK = "@stored:"
"""`previous_response_id` values `STORED_MARK + <pool>` stand for the fleet's stored response of that pool
(`Fleet.stored`; ids exist only once the fleet runs): the test puts the real id in (`with_stored_ids`)."""

KEEP, DROP, REPLACE = "keep", "drop", "replace"
EDGE_INTEGERS = [-1, 0, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**400]
EDGE_FLOATS = [0.0, -0.0, 1.5, 2.0, 1e308, -1e308, 5e-324]
TOKEN_EDGES = [-1, 0, 0xD800, 0xDFFF, 0x10FFFF, 0x110000, 2**63, 2**64, 1.5, True, "a", None]

leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(EDGE_INTEGERS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(EDGE_FLOATS),
    st.text(max_size=20),
)
json_values = st.recursive(
    leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=10,
)
"""Any JSON value (unicode text, integers of any size, floats), a few levels deep."""

unicode_text = st.text(max_size=60) | st.sampled_from(
    ["", " ", "héllo ✓ 中文 😀", "\x00\x01\u202e", "a" * 400]
)


def nested(value: Any, depth: int) -> Any:
    """`value` wrapped in `depth` arrays (an explicit loop: no recursion)."""
    for _ in range(depth):
        value = [value]
    return value


nested_values = st.builds(nested, unicode_text, st.integers(1, 20))
"""Arrays nested up to 20 deep: across the gateway's limit of 16 for prompt fields."""

content_parts = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": unicode_text}), min_size=1, max_size=3
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]) | json_values},
        optional={"content": unicode_text | content_parts | st.none() | nested_values | json_values},
    ),
    max_size=4,
)
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from([MODEL, REWRITE, "no-such-model", "", MODEL.upper()]) | json_values,
    "stream": st.sampled_from([True, False, None]) | json_values,
    "max_tokens": st.integers(0, 8)
    | st.sampled_from(EDGE_INTEGERS + EDGE_FLOATS + ["5", True])
    | json_values,
    "max_completion_tokens": st.integers(0, 8) | st.sampled_from([*EDGE_INTEGERS, "5", False]) | json_values,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": json_values}) | json_values,
    "messages": messages | json_values,
    "prompt": unicode_text
    | st.lists(unicode_text, max_size=3)
    | st.lists(st.integers(-5, 2**20), max_size=5)
    | nested_values
    | json_values,
    "input": unicode_text
    | st.lists(st.integers(0, 1000), max_size=5)
    | messages
    | nested_values
    | json_values,
    "tokens": st.lists(st.integers(0, 300) | st.sampled_from(TOKEN_EDGES), max_size=6) | json_values,
    "user": unicode_text | json_values,
    "max_output_tokens": st.integers(0, 8) | st.sampled_from([*EDGE_INTEGERS, "5", True]) | json_values,
    "previous_response_id": st.sampled_from(
        [STORED_MARK + MODEL, STORED_MARK + REWRITE, "resp_unknown", "", None]
    )
    | unicode_text
    | json_values,
    "instructions": unicode_text | json_values,
    "system": unicode_text | content_parts | nested_values | json_values,
    "query": unicode_text | nested_values | json_values,
    "documents": st.lists(unicode_text, max_size=3) | nested_values | json_values,
    "text_1": unicode_text | st.lists(unicode_text, max_size=3) | nested_values | json_values,
    "text_2": unicode_text | st.lists(unicode_text, max_size=3) | nested_values | json_values,
}
BASE: dict[Endpoint, dict[str, Any]] = {
    Endpoint.CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3},
    Endpoint.COMPLETIONS: {"model": MODEL, "prompt": "hello", "max_tokens": 3},
    Endpoint.EMBEDDINGS: {"model": MODEL, "input": "hello"},
    Endpoint.TOKENIZE: {"model": MODEL, "prompt": "hello"},
    Endpoint.DETOKENIZE: {"model": MODEL, "tokens": [104, 105]},
    Endpoint.RESPONSES: {"model": MODEL, "input": "hello", "max_output_tokens": 3},
    Endpoint.MESSAGES: {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hello"}]},
    Endpoint.COUNT_TOKENS: {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]},
    Endpoint.RERANK: {"model": MODEL, "query": "hello", "documents": ["hello world", "bye"]},
    Endpoint.SCORE: {"model": MODEL, "text_1": "hello", "text_2": ["hello world", "bye"]},
    Endpoint.POOLING: {"model": MODEL, "input": "hello"},
    Endpoint.CLASSIFY: {"model": MODEL, "input": "hello"},
}
FUZZED_ENDPOINTS = tuple(BASE)
"""The endpoints this fuzz suite models (the oracle's rules): all but `/rerank`, the same endpoint as
`/v1/rerank` on another path."""
ENDPOINT_GROUPS: tuple[tuple[Endpoint, ...], ...] = (
    *((endpoint,) for endpoint in FUZZED_ENDPOINTS[:5]),
    (Endpoint.RESPONSES,),
    (Endpoint.MESSAGES, Endpoint.COUNT_TOKENS),
    (Endpoint.RERANK, Endpoint.SCORE, Endpoint.POOLING, Endpoint.CLASSIFY),
)
"""How the per-endpoint properties are parametrised: each OpenAI endpoint on its own, then one group per
newer surface (Responses, Messages, pooling) whose examples are spread over its endpoints, so the run
stays about a minute."""
_FIELDS = (
    "model",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "stream_options",
    "messages",
    "prompt",
    "input",
    "tokens",
    "user",
)
_EXTRA_FIELDS: dict[Endpoint, tuple[str, ...]] = {
    Endpoint.RESPONSES: ("max_output_tokens", "previous_response_id", "instructions"),
    Endpoint.MESSAGES: ("system",),
    Endpoint.COUNT_TOKENS: ("system",),
    Endpoint.RERANK: ("query", "documents"),
    Endpoint.SCORE: ("text_1", "text_2"),
}


@st.composite
def object_bodies(draw: st.DrawFn, endpoint: Endpoint) -> dict[str, Any]:
    """A JSON object: the endpoint's valid base with one read field replaced or dropped (half of the
    bodies: the likeliest way to get a wrong type past the gateway to an engine), or each read field
    kept, dropped or replaced; and maybe extra fields."""
    body = dict(BASE[endpoint])
    fields = _FIELDS + _EXTRA_FIELDS.get(endpoint, ())
    if draw(st.booleans()):
        name = draw(st.sampled_from(fields))
        actions = {name: draw(st.sampled_from([DROP, REPLACE, REPLACE, REPLACE]))}
    else:
        actions = {
            name: draw(st.sampled_from([KEEP, KEEP, KEEP, KEEP, DROP, REPLACE, REPLACE])) for name in fields
        }
    for name, action in actions.items():
        if action == DROP:
            body.pop(name, None)
        elif action == REPLACE:
            body[name] = draw(FIELD_VALUES[name])
    extra_names = st.text(min_size=1, max_size=8).filter(lambda k: k not in FIELD_VALUES)
    return {**body, **draw(st.dictionaries(extra_names, json_values, max_size=2))}


def encode(body: Any, ensure_ascii: bool) -> bytes:
    """JSON as a client library writes it (Python's encoder: any integer, `NaN` is not produced)."""
    return json.dumps(body, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")


@st.composite
def routed_bodies(draw: st.DrawFn, endpoint: Endpoint) -> bytes:
    """The endpoint's valid base for either pool or an unknown model, streamed or not (where it can
    stream), and on the Responses API continuing either pool's stored response, an unknown one or none:
    the routing side of each surface (served or not by the pool, state affinity, stream endings)."""
    body = {**BASE[endpoint], "model": draw(st.sampled_from([MODEL, REWRITE, "no-such-model"]))}
    if endpoint.can_stream:
        body["stream"] = draw(st.booleans())
    if endpoint is Endpoint.RESPONSES:
        previous = [STORED_MARK + MODEL, STORED_MARK + REWRITE, "resp_unknown", None]
        body["previous_response_id"] = draw(st.sampled_from(previous))
    return encode(body, ensure_ascii=True)


@st.composite
def object_requests(draw: st.DrawFn, endpoint: Endpoint) -> bytes:
    return encode(draw(object_bodies(endpoint)), draw(st.booleans()))


@st.composite
def broken_bodies(draw: st.DrawFn, endpoint: Endpoint) -> bytes:
    """Bytes that are no JSON object: other JSON values, truncations, invalid UTF-8, non-JSON tokens,
    lone surrogates, a byte-order mark, or a body past the size limit."""
    valid = encode(BASE[endpoint], ensure_ascii=True)
    kind = draw(st.integers(0, 8))
    if kind == 0:
        return draw(st.binary(max_size=200))
    if kind == 1:
        return encode(draw(json_values.filter(lambda v: not isinstance(v, dict))), ensure_ascii=True)
    if kind == 2:
        return valid[: draw(st.integers(0, len(valid) - 1))]
    if kind == 3:
        token = draw(
            st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999", b"0x10", b"01"])
        )
        return valid[:-1] + b', "max_tokens": ' + token + b"}"
    if kind == 4:
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80abc"]))
        return valid.replace(b'"hello"', b'"he' + bad + b'llo"').replace(b"104", b'"' + bad + b'"')
    if kind == 5:
        return valid.replace(b'"hello"', b'"\\ud800"').replace(b"104", b'"\\udfff"')
    if kind == 6:
        return b"\xef\xbb\xbf" + valid
    if kind == 7:
        padding = b"a" * (MAX_BODY_BYTES + draw(st.integers(1, 4096)))
        return valid[:-1] + b', "pad": "' + padding + b'"}'
    return draw(st.sampled_from([b"", b" ", b"{}", b"{", b"}", b"[]", b"null", b'{"model": }', b"{'a': 1}"]))


_VALUE_CHARS = st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f")
header_values = st.text(_VALUE_CHARS, max_size=40).map(lambda s: s.strip(" ").encode("latin-1"))
"""Header values h11 lets a client send: visible ASCII, spaces inside, and obs-text (0x80-0xFF)."""
_NOT_A_DEADLINE = [b"0", b"-5", b"abc", b"1.5", b"", b"1e3", b"0x10", b"+0", b"\xb2"]
timer_values = st.integers(2000, 10**6).map(lambda n: str(n).encode()) | st.sampled_from(
    [*_NOT_A_DEADLINE, b"99999999999999999999999", b"+3000", b"3_000"]
)
"""Deadline overrides: positive ones of 2 s and more (a shorter one may rightly end in a 504), and
values the gateway must refuse."""
priorities = (
    st.sampled_from([b"critical", b"interactive", b"batch", b"BATCH", b"Batch", b"vip"]) | header_values
)
request_headers = st.fixed_dictionaries(
    {},
    optional={
        "x-request-id": header_values,
        "x-gateway-priority": priorities,
        "x-session-id": header_values,
        "x-gateway-ttft-timeout-ms": timer_values,
        "x-gateway-idle-timeout-ms": timer_values,
        "idempotency-key": header_values,
        "authorization": header_values,
        "content-type": st.sampled_from([b"application/json", b"text/plain", b""]) | header_values,
    },
)


READ_FIELDS: dict[Endpoint, tuple[str, ...]] = {
    Endpoint.CHAT: (
        "model",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "stream_options",
        "messages",
        "user",
    ),
    Endpoint.COMPLETIONS: (
        "model",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "stream_options",
        "prompt",
        "user",
    ),
    Endpoint.EMBEDDINGS: ("model", "stream", "input", "user"),
    Endpoint.TOKENIZE: ("model", "stream", "prompt", "messages", "user"),
    Endpoint.DETOKENIZE: ("model", "stream", "tokens", "user"),
    Endpoint.RESPONSES: (
        "model",
        "stream",
        "max_output_tokens",
        "max_tokens",
        "input",
        "instructions",
        "previous_response_id",
        "user",
    ),
    Endpoint.MESSAGES: ("model", "stream", "max_tokens", "messages", "system"),
    Endpoint.COUNT_TOKENS: ("model", "stream", "messages", "system"),
    Endpoint.RERANK: ("model", "stream", "query", "documents"),
    Endpoint.SCORE: ("model", "stream", "text_1", "text_2"),
    Endpoint.POOLING: ("model", "stream", "input"),
    Endpoint.CLASSIFY: ("model", "stream", "input"),
}
"""The fields the gateway or an engine reads, per endpoint."""
_VALID_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "stream": (bool, type(None)),
    "max_tokens": (int,),
    "max_completion_tokens": (int,),
    "stream_options": (dict, type(None)),
    "messages": (list,),
    "prompt": (str, list),
    "input": (str, list),
    "tokens": (list,),
    "user": (str,),
    "max_output_tokens": (int,),
    "previous_response_id": (str, type(None)),
    "instructions": (str, type(None)),
    "system": (str, list, type(None)),
    "query": (str,),
    "documents": (list,),
    "text_1": (str, list),
    "text_2": (str, list),
}
_BAD_ITEMS: st.SearchStrategy[list[Any]] = st.lists(
    st.sampled_from([None, True, 1.5, 7, "x", {}, [[]], {"role": []}]), min_size=1, max_size=3
)


def _wrong_type(name: str, value: Any) -> bool:
    if isinstance(value, bool) and name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        return True
    return not isinstance(value, _VALID_TYPES[name])


@st.composite
def wrong_type_bodies(draw: st.DrawFn, endpoint: Endpoint) -> bytes:
    """The endpoint's valid base with one field it reads of another JSON type (or, for an array field,
    an array of wrong items): every example is a type error for the gateway or for the engine."""
    name = draw(st.sampled_from(READ_FIELDS[endpoint]))
    values = json_values.filter(lambda v: _wrong_type(name, v))
    if _VALID_TYPES[name] == (list,) or list in _VALID_TYPES[name]:
        values = values | _BAD_ITEMS
    return encode({**BASE[endpoint], name: draw(values)}, ensure_ascii=True)


def with_stored_ids(raw: bytes, stored: dict[str, str]) -> bytes:
    """`raw` with each `STORED_MARK + <pool>` string replaced by that pool's stored response id."""
    for response_id, pool in stored.items():
        raw = raw.replace(f'"{STORED_MARK}{pool}"'.encode(), f'"{response_id}"'.encode())
    return raw
