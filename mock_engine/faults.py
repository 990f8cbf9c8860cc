"""Fault injection for the mock engine: settings, validation and the per-request decision (pure, no I/O).

Faults are set at start (CLI flags, see `docs/MOCK_ENGINE.md`) and at run time with `POST /mock/faults`
(a JSON object of the fields to change; `GET /mock/faults` shows them, `DELETE /mock/faults` clears them).
What an HTTP client sees for each fault:

- **error** (`error_rate`, `error_status`, `retry_after_s`): that fraction of API requests (generation,
  embeddings, tokenize) is answered at once with `error_status` (500, 503, 429...) and an OpenAI-style body
  `{"error": {"message": "injected fault", "type": "mock_engine_error", "code": status}}`; 429 and 503 carry
  `Retry-After: ceil(retry_after_s)` when it is set. Nothing is generated (counted in `failed_injected`,
  not in `started`).
- **slow first token** (`slow_first_token_ms`, `slow_first_token_rate`): that fraction of generations waits
  an extra `slow_first_token_ms` (wall clock, not scaled by `--speed`) before reaching the engine. A stream
  gets its 200 headers and (chat) role chunk at once, then the first content token late; later tokens keep
  their spacing. A non-streamed answer comes that much later. Counted in `slowed_injected`.
- **stall** (`stall_after_tokens`, `stall_rate`): that fraction of generations goes silent after N content
  tokens (0: right after the headers and role chunk): no finish chunk, no `[DONE]`, the connection stays
  open until the client leaves (counted in `stalled_injected`, then in `aborted` when the client
  disconnects) or the server shuts down. A non-streamed request gets no response at all. N larger than the
  output length: no effect.
- **crash** (`crash_after_tokens`, `crash_rate`): that fraction of generations is cut after N content
  tokens by a TCP reset (SO_LINGER 0, then abort; the bytes already written are delivered first). A stream
  reads its 200 headers and N token chunks, then the next read fails with ECONNRESET (httpx: `ReadError`,
  "Connection reset by peer"); a non-streamed request gets no response (httpx: `ReadError`, or
  `RemoteProtocolError` "Server disconnected"). Counted in `crashed_injected`. Crash wins a tie with stall.
- **jitter** (`jitter_ms`): before each content token, an extra pause drawn uniformly from [0, jitter_ms]
  ms, so inter-token gaps grow by jitter_ms / 2 on average.
- **refuse** (`refuse_connections`, `refuse_for_s`): while on, the listening sockets stop listening: new
  TCP connections are refused by the kernel (ECONNREFUSED; httpx: `ConnectError`); idle keep-alive
  connections are closed; in-flight requests finish, then their connections close. The admin endpoint is
  unreachable too, so `refuse_for_s` turns refusal off by itself after that many seconds (else, in-process:
  `MockEngineApp.set_faults_threadsafe`). See `listeners.py`.
- **poison prompts** (`poison_marker`, `poison_effect`): every generation request whose prompt text (the
  chat message contents joined with "\n", or the completions prompt) contains `poison_marker` gets
  `poison_effect`, with no rate and no other fault: "stall" (200 headers and role chunk, then silence
  before the first content token, as `stall_after_tokens=0`), "error" (500 with the error body above,
  message "injected fault (poison prompt)", no Retry-After) or "crash" (TCP reset before the first content
  token, as `crash_after_tokens=0`). Other requests are untouched. Counted in `poisoned_injected`, and
  also in `stalled_injected`, `failed_injected` or `crashed_injected`.

Determinism: each request that reaches the fault decision (in arrival order) takes exactly
`DRAWS_PER_REQUEST` draws from the engine's seeded `random.Random`, whatever the settings and whether or
not it is poisoned, and its jitter comes from its own `random.Random` seeded by one of those draws: the
same seed and the same request order give the same faults, even when streams interleave.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

Interruption = Literal["stall", "crash"]
PoisonEffect = Literal["stall", "error", "crash"]
POISON_EFFECTS: tuple[PoisonEffect, ...] = ("stall", "error", "crash")
POISON_ERROR_STATUS = 500
POISON_ERROR_MESSAGE = "injected fault (poison prompt)"
RETRY_AFTER_STATUSES = frozenset({429, 503})
DRAWS_PER_REQUEST = 5
_STRING_KINDS = frozenset({"str", "PoisonEffect"})
MAX_SETTING_INT = 2**63 - 1
"""Integer settings fit 64 bits (the settings are answered as JSON)."""
_RATES = ("error_rate", "slow_first_token_rate", "stall_rate", "crash_rate")
_NON_NEGATIVE = (
    "retry_after_s",
    "slow_first_token_ms",
    "stall_after_tokens",
    "crash_after_tokens",
    "jitter_ms",
)


class FaultSettingsError(ValueError):
    """An invalid fault setting; `field` names it (empty for whole-body problems)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class FaultSettings:
    """The fault configuration of one mock engine (see the module docstring for each field's effect)."""

    error_rate: float = 0.0
    error_status: int = 500
    retry_after_s: float | None = None
    slow_first_token_ms: float = 0.0
    slow_first_token_rate: float = 1.0
    stall_after_tokens: int | None = None
    stall_rate: float = 1.0
    crash_after_tokens: int | None = None
    crash_rate: float = 1.0
    jitter_ms: float = 0.0
    refuse_connections: bool = False
    refuse_for_s: float | None = None
    poison_marker: str | None = None
    poison_effect: PoisonEffect = "stall"

    def __post_init__(self) -> None:
        for name in _RATES:
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise FaultSettingsError(name, f"{name} must be within [0, 1], got {value!r}")
        if not 400 <= self.error_status <= 599:
            message = f"error_status must be an HTTP error status (400-599), got {self.error_status!r}"
            raise FaultSettingsError("error_status", message)
        for name in _NON_NEGATIVE:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise FaultSettingsError(name, f"{name} must be a finite number >= 0, got {value!r}")
        if self.refuse_for_s is not None and not (math.isfinite(self.refuse_for_s) and self.refuse_for_s > 0):
            raise FaultSettingsError("refuse_for_s", f"refuse_for_s must be > 0, got {self.refuse_for_s!r}")
        if self.poison_marker is not None and (
            not isinstance(self.poison_marker, str) or not self.poison_marker
        ):
            message = f"poison_marker must be a non-empty string or null, got {self.poison_marker!r}"
            raise FaultSettingsError("poison_marker", message)
        if self.poison_effect not in POISON_EFFECTS:
            message = f"poison_effect must be one of {', '.join(POISON_EFFECTS)}, got {self.poison_effect!r}"
            raise FaultSettingsError("poison_effect", message)

    def poisons(self, prompt: str | None) -> bool:
        """Whether a generation request with this prompt text is poisoned (None: not a generation)."""
        return self.poison_marker is not None and prompt is not None and self.poison_marker in prompt

    def updated(self, changes: Mapping[str, Any]) -> FaultSettings:
        """A copy with `changes` (decoded JSON) applied; `FaultSettingsError` names the first bad field."""
        if not isinstance(changes, Mapping):
            raise FaultSettingsError("", "the body must be a JSON object of fault fields")
        kinds = {f.name: str(f.type) for f in fields(self)}
        unknown = sorted(set(changes) - set(kinds))
        if unknown:
            raise FaultSettingsError(
                unknown[0],
                f"unknown fault field(s): {', '.join(unknown)}; known: {', '.join(kinds)}",
            )
        coerced = {name: _coerce(name, kinds[name], value) for name, value in changes.items()}
        return replace(self, **coerced)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _coerce(name: str, kind: str, value: Any) -> Any:
    """Check one decoded JSON value against the field's declared type (`float`, `int | None`, `bool`...)."""
    base, _, rest = kind.partition(" |")
    if value is None:
        if "None" in rest:
            return None
        raise FaultSettingsError(name, f"{name} cannot be null")
    if base in _STRING_KINDS:
        if isinstance(value, str):
            return value
        raise FaultSettingsError(name, f"{name} must be a string, got {value!r}")
    if base == "bool":
        if isinstance(value, bool):
            return value
        raise FaultSettingsError(name, f"{name} must be true or false, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultSettingsError(name, f"{name} must be a number, got {value!r}")
    if base == "int":
        if isinstance(value, float) and not value.is_integer():
            raise FaultSettingsError(name, f"{name} must be an integer, got {value!r}")
        if abs(value) > MAX_SETTING_INT:
            raise FaultSettingsError(name, f"{name} must be at most {MAX_SETTING_INT}, got {value!r}")
        return int(value)
    return float(value)


@dataclass(frozen=True, slots=True)
class Draws:
    """The random numbers one request consumes: four uniforms in [0, 1) and a seed for its jitter."""

    error: float
    slow: float
    stall: float
    crash: float
    jitter_seed: int

    @classmethod
    def take(cls, rng: random.Random) -> Draws:
        """Always `DRAWS_PER_REQUEST` draws, in this order."""
        return cls(rng.random(), rng.random(), rng.random(), rng.random(), rng.getrandbits(64))


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What happens to one request. The default plan is a normal request."""

    error_status: int | None = None
    retry_after_s: float | None = None
    first_token_delay_s: float = 0.0
    stall_after_tokens: int | None = None
    crash_after_tokens: int | None = None
    jitter_ms: float = 0.0
    jitter_seed: int = 0
    poisoned: bool = False

    def retry_after_header(self) -> str | None:
        """`Retry-After` value (whole seconds, rounded up) for the injected error, or None."""
        if self.error_status not in RETRY_AFTER_STATUSES or self.retry_after_s is None:
            return None
        return str(math.ceil(self.retry_after_s))

    def error_message(self) -> str:
        return POISON_ERROR_MESSAGE if self.poisoned else "injected fault"

    def interruption(self, emitted_tokens: int) -> Interruption | None:
        """The fault due once `emitted_tokens` content tokens have been sent (crash wins a tie)."""
        if self.crash_after_tokens == emitted_tokens:
            return "crash"
        if self.stall_after_tokens == emitted_tokens:
            return "stall"
        return None

    def jitter(self) -> Jitter:
        return Jitter(self.jitter_ms, self.jitter_seed)


class Jitter:
    """Per-token extra delays in seconds, uniform in [0, max_ms] ms, from the request's own seeded stream."""

    def __init__(self, max_ms: float, seed: int) -> None:
        self._max_s = max_ms / 1000.0
        self._rng = random.Random(seed)

    def next_s(self) -> float:
        return self._rng.uniform(0.0, self._max_s) if self._max_s > 0 else 0.0


def decide(settings: FaultSettings, draws: Draws, poisoned: bool = False) -> FaultPlan:
    """The plan for one request: a poisoned one gets its poison effect only (its draws unused); otherwise
    an injected error excludes every other fault."""
    if poisoned:
        if settings.poison_effect == "error":
            return FaultPlan(error_status=POISON_ERROR_STATUS, poisoned=True)
        if settings.poison_effect == "crash":
            return FaultPlan(crash_after_tokens=0, poisoned=True)
        return FaultPlan(stall_after_tokens=0, poisoned=True)
    if draws.error < settings.error_rate:
        return FaultPlan(error_status=settings.error_status, retry_after_s=settings.retry_after_s)
    slow = settings.slow_first_token_ms > 0 and draws.slow < settings.slow_first_token_rate
    stall = settings.stall_after_tokens is not None and draws.stall < settings.stall_rate
    crash = settings.crash_after_tokens is not None and draws.crash < settings.crash_rate
    return FaultPlan(
        first_token_delay_s=settings.slow_first_token_ms / 1000.0 if slow else 0.0,
        stall_after_tokens=settings.stall_after_tokens if stall else None,
        crash_after_tokens=settings.crash_after_tokens if crash else None,
        jitter_ms=settings.jitter_ms,
        jitter_seed=draws.jitter_seed,
    )


class FaultInjector:
    """Current settings plus the seeded generator: `plan()` decides the next request's faults."""

    def __init__(self, settings: FaultSettings, rng: random.Random) -> None:
        self.settings = settings
        self._rng = rng

    def plan(self, prompt: str | None = None) -> FaultPlan:
        """The next request's plan; `prompt` is a generation's prompt text (None for other requests).
        Always takes `DRAWS_PER_REQUEST` draws, poisoned or not."""
        draws = Draws.take(self._rng)
        return decide(self.settings, draws, self.settings.poisons(prompt))
