"""Routing keys: canonical prompt text, chained prefix block hashes, prefix key and session key.

Canonical text (what the prefix policies see; the body itself is forwarded unchanged):
- chat: one `<|role|>\\ncontent\\n` section per message, in order, with `system`/`developer` messages
  moved first (stable); a content-part list renders text parts joined by `\\n` and every other part as
  `<|type:digest|>` (xxh3 of its payload, so two different images never share a prefix);
- completion / embedding input: the string, strings joined by `\\n`, or token ids joined by spaces.

Blocks and hashes (all sizes in characters, not tokens; ~4 characters per token):
    text    = canonical[:max_prefix_chars]
    block_i = text[i·B : (i+1)·B]          (the last may be partial: every non-empty prompt has a key)
    h_0    = xxh3_64(model)                (seed: equal text under different models never collides)
    h_i+1  = xxh3_64(block_i, seed=h_i)    (chained: h_i identifies the whole prefix up to block i)
    prefix_key = h_min(K, n)               (the hash of the first K blocks, or of all when fewer)

Defaults: B = 64 characters (≈16 tokens, vLLM's default KV block), max_prefix_chars = 16384 (256 blocks),
K = 16 blocks (1024 characters: long enough to cover a shared system prompt's head, short enough that
requests sharing it land together). Session key: the `x-session-id` header, else the body's `user`,
else none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from core.tokens import estimate_tokens
from router.options import OptionReader
from router.types import CapTier, RoutingRequest

DEFAULT_BLOCK_SIZE_CHARS = 64
DEFAULT_MAX_PREFIX_CHARS = 16_384
DEFAULT_PREFIX_KEY_BLOCKS = 16

KEY_OPTION_NAMES = frozenset({"block_size_chars", "max_prefix_chars", "prefix_key_blocks"})
"""Option names `KeySettings.from_options` reads; every preset accepts them beside its own."""

_LEADING_ROLES = frozenset({"system", "developer"})
_TEXT_PART_TYPES = frozenset({"text", "input_text"})


@dataclass(frozen=True, slots=True)
class KeySettings:
    """How prompts become block hashes (per pool). Sizes are characters; see the module docstring."""

    block_size_chars: int = DEFAULT_BLOCK_SIZE_CHARS
    max_prefix_chars: int = DEFAULT_MAX_PREFIX_CHARS
    prefix_key_blocks: int = DEFAULT_PREFIX_KEY_BLOCKS

    def __post_init__(self) -> None:
        for name in ("block_size_chars", "max_prefix_chars", "prefix_key_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any], where: str = "routing keys") -> KeySettings:
        """Read `block_size_chars`, `max_prefix_chars`, `prefix_key_blocks`; other names are ignored."""
        read = OptionReader(options, where)
        return cls(
            block_size_chars=read.integer("block_size_chars", DEFAULT_BLOCK_SIZE_CHARS, minimum=1),
            max_prefix_chars=read.integer("max_prefix_chars", DEFAULT_MAX_PREFIX_CHARS, minimum=1),
            prefix_key_blocks=read.integer("prefix_key_blocks", DEFAULT_PREFIX_KEY_BLOCKS, minimum=1),
        )


@dataclass(frozen=True, slots=True)
class RoutingKeys:
    """The keys of one request: chained block hashes, the prefix key and the session key."""

    prefix_hashes: tuple[int, ...]
    prefix_key: int | None
    session_key: str | None


def _utf8(text: str) -> bytes:
    """UTF-8 bytes; lone surrogates (legal in JSON strings) pass through instead of raising."""
    return text.encode("utf-8", "surrogatepass")


def _digest(value: object) -> str:
    """xxh3-64 of a JSON value's structure and scalars, walked with an explicit stack: the depth of a
    client's value never becomes Python recursion (no RecursionError on 1,000 nested lists)."""
    digest = xxhash.xxh3_64()
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            digest.update(b"{%d" % len(item))
            for key, child in item.items():
                digest.update(_utf8(repr(key)))
                stack.append(child)
        elif isinstance(item, list | tuple):
            digest.update(b"[%d" % len(item))
            stack.extend(reversed(item))
        else:
            digest.update(_utf8(repr(item)))
    return digest.hexdigest()


def _render_part(part: object) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping):
        kind = part.get("type")
        text = part.get("text")
        if kind in _TEXT_PART_TYPES and isinstance(text, str):
            return text
        return f"<|{kind}:{_digest(part.get(kind) if isinstance(kind, str) else part)}|>"
    return f"<|part:{_digest(part)}|>"


def _render_content(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_render_part(part) for part in content)
    return f"<|content:{_digest(content)}|>"


def _is_leading(role: object) -> bool:
    """A system/developer role (any other value, an unhashable one included, is not)."""
    return isinstance(role, str) and role in _LEADING_ROLES


def render_chat_messages(messages: object) -> str:
    """Role-tagged text of a chat `messages` list, system/developer first; "" when not a list.

    Each message renders as `<|role|>\\ncontent\\n`. Only `role` and `content` count; tool calls and
    names are left out (they do not change which prefix a conversation shares with its next turn).
    """
    if not isinstance(messages, list):
        return ""
    leading: list[str] = []
    rest: list[str] = []
    for message in messages:  # one pass: this runs on every chat request
        if type(message) is dict or isinstance(message, Mapping):
            role = message.get("role")
            section = f"<|{role}|>\n{_render_content(message.get('content'))}\n"
            (leading if _is_leading(role) else rest).append(section)
    return "".join(leading + rest)


def _render_token(token: object) -> str:
    if isinstance(token, str):
        return token
    if isinstance(token, int) and not isinstance(token, bool):
        return str(token)
    return ""


def _render_prompt_item(item: object) -> str:
    """A string, a token id, or a list of those (one level: the API nests prompts no deeper)."""
    if isinstance(item, list):
        return " ".join(_render_token(token) for token in item)
    return _render_token(item)


def render_completion_prompt(prompt: object) -> str:
    """Text of a completion `prompt` (or embedding `input`): a string, a list of strings (joined by
    newlines), a list of token ids (joined by spaces) or a list of such lists; "" for anything else."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list):
        return ""
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return _render_prompt_item(prompt)
    return "\n".join(_render_prompt_item(item) for item in prompt)


def canonical_prompt_text(body: Mapping[str, Any]) -> str:
    """Canonical text of a parsed request body: `messages` (chat), else `prompt`, else `input`."""
    if "messages" in body:
        return render_chat_messages(body["messages"])
    if "prompt" in body:
        return render_completion_prompt(body["prompt"])
    return render_completion_prompt(body.get("input"))


def block_hashes(model: str, prompt_text: str, settings: KeySettings) -> tuple[int, ...]:
    """Chained xxh3-64 hashes of the prompt's blocks, seeded by the model (see module docstring)."""
    text = prompt_text[: settings.max_prefix_chars]
    size = settings.block_size_chars
    hash64 = xxhash.xxh3_64_intdigest
    chained = hash64(_utf8(model))
    hashes: list[int] = []
    if text.isascii():  # one character per byte: the blocks are slices of one encoding (same bytes)
        data = text.encode("ascii")
        for start in range(0, len(data), size):
            chained = hash64(data[start : start + size], seed=chained)
            hashes.append(chained)
        return tuple(hashes)
    for start in range(0, len(text), size):
        chained = hash64(_utf8(text[start : start + size]), seed=chained)
        hashes.append(chained)
    return tuple(hashes)


def prefix_key_of(prefix_hashes: Sequence[int], prefix_key_blocks: int) -> int | None:
    """The hash of the first `prefix_key_blocks` blocks (of all when fewer); None for no blocks."""
    if not prefix_hashes:
        return None
    return prefix_hashes[min(prefix_key_blocks, len(prefix_hashes)) - 1]


def session_key_of(header_value: str | None, body_user: object = None) -> str | None:
    """The `x-session-id` header when non-blank, else the body's `user` when a non-blank string."""
    for candidate in (header_value, body_user):
        if isinstance(candidate, str) and candidate.strip():
            return candidate.strip()
    return None


def build_routing_keys(
    model: str, prompt_text: str, settings: KeySettings | None = None, session_key: str | None = None
) -> RoutingKeys:
    """Block hashes and prefix key of `prompt_text` under `settings` (defaults when None)."""
    settings = settings or KeySettings()
    hashes = block_hashes(model, prompt_text, settings)
    return RoutingKeys(hashes, prefix_key_of(hashes, settings.prefix_key_blocks), session_key)


def build_routing_request(
    model: str,
    prompt_text: str,
    settings: KeySettings | None = None,
    *,
    session_key: str | None = None,
    estimated_prompt_tokens: int | None = None,
    max_tokens: int | None = None,
    exclude: frozenset[str] = frozenset(),
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    lora_adapter: bool = False,
    cap_tier: CapTier = CapTier.PLAIN,
) -> RoutingRequest:
    """The `RoutingRequest` the gateway hands to `Policy.decide`, keys included.

    `estimated_prompt_tokens` defaults to ceil(len(prompt_text) / 4) (`core.tokens`). For a retry, use
    `dataclasses.replace(request, exclude=...)`: the keys stay valid.
    """
    keys = build_routing_keys(model, prompt_text, settings, session_key)
    if estimated_prompt_tokens is None:
        estimated_prompt_tokens = estimate_tokens(prompt_text)
    return RoutingRequest(
        model=model,
        prompt_text=prompt_text,
        estimated_prompt_tokens=estimated_prompt_tokens,
        max_tokens=max_tokens,
        session_key=keys.session_key,
        exclude=exclude,
        prefix_hashes=keys.prefix_hashes,
        prefix_key=keys.prefix_key,
        block_size_chars=(settings or KeySettings()).block_size_chars,
        slo_ttft_s=slo_ttft_s,
        slo_tpot_s=slo_tpot_s,
        lora_adapter=lora_adapter,
        cap_tier=cap_tier,
    )
