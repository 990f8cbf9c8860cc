"""Fake-clock drivers and request builders shared by the physics-core tests."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from mock_engine.core import EngineRequest, TokenEvent
from mock_engine.physics import EngineProfile, PhysicsCore, load_profile


def tiny(**scheduler_or_prefill: int | None) -> EngineProfile:
    """The `tiny` profile, optionally with `max_num_seqs` / `chunk_tokens_per_step` overridden."""
    profile = load_profile("tiny")
    if "max_num_seqs" in scheduler_or_prefill:
        max_num_seqs = scheduler_or_prefill["max_num_seqs"]
        assert max_num_seqs is not None
        profile = replace(profile, scheduler=replace(profile.scheduler, max_num_seqs=max_num_seqs))
    if "chunk_tokens_per_step" in scheduler_or_prefill:
        chunk = scheduler_or_prefill["chunk_tokens_per_step"]
        profile = replace(profile, prefill=replace(profile.prefill, chunk_tokens_per_step=chunk))
    return profile


def request(
    request_id: str, prompt_tokens: int, max_tokens: int, arrival_s: float = 0.0, text: str | None = None
) -> EngineRequest:
    """A request whose text is unique to its id unless `text` is given (4 characters per token)."""
    if text is None:
        text = (request_id + "|" * 4 * prompt_tokens)[: 4 * prompt_tokens]
    return EngineRequest(request_id, text, prompt_tokens, max_tokens, arrival_s)


def run_until_idle(core: PhysicsCore, limit_steps: int = 1_000_000) -> list[TokenEvent]:
    """Jump from event to event until nothing is running or waiting."""
    events: list[TokenEvent] = []
    for _ in range(limit_steps):
        next_s = core.next_event_s()
        if next_s is None:
            return events
        events.extend(core.advance(next_s))
    raise AssertionError("core did not go idle")


def by_request(events: list[TokenEvent]) -> dict[str, list[TokenEvent]]:
    grouped: dict[str, list[TokenEvent]] = defaultdict(list)
    for event in events:
        grouped[event.request_id].append(event)
    return dict(grouped)


def first_token_s(events: list[TokenEvent], request_id: str) -> float:
    return next(e.time_s for e in events if e.request_id == request_id and e.index == 0)


def assert_complete(events: list[TokenEvent], max_tokens_by_id: dict[str, int]) -> None:
    """Every request emitted indices 0..max-1 exactly once, in time order, finished only on the last."""
    grouped = by_request(events)
    assert set(grouped) == set(max_tokens_by_id)
    for request_id, own in grouped.items():
        assert [e.index for e in own] == list(range(max_tokens_by_id[request_id]))
        assert [e.finished for e in own] == [False] * (len(own) - 1) + [True]
        times = [e.time_s for e in own]
        assert times == sorted(times)
