"""Workload generators: deterministic under a seed, and the shapes they promise."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path

import pytest

from bench.generators import LongContextMix, MultiTurn, NoSharing, SharedPrefix, ZipfPrefixes
from bench.presets import PRESETS, TraceWorkload, build_workload, read_trace, write_trace
from bench.workload import (
    RequestSpec,
    Workload,
    parse_priority_mix,
    synthetic_text,
    with_priorities,
    zipf_sampler,
)

BLOCK_CHARS = 64  # one prefix-cache block: 16 tokens × 4 characters


def take(workload: Workload, n: int, seed: int = 0) -> list[RequestSpec]:
    return list(itertools.islice(workload.requests(seed), n))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_deterministic_under_a_seed(name: str) -> None:
    workload = build_workload(name)
    assert take(workload, 20, seed=5) == take(workload, 20, seed=5)
    assert take(workload, 20, seed=5) != take(workload, 20, seed=6)


def test_synthetic_text_has_exact_token_length() -> None:
    rng = random.Random(1)
    for tokens in (1, 7, 128, 2048):
        text = synthetic_text(rng, tokens)
        assert len(text) == 4 * tokens
    assert synthetic_text(rng, 0) == ""


def test_independent_texts_share_no_first_block() -> None:
    rng = random.Random(2)
    firsts = {synthetic_text(rng, 64)[:BLOCK_CHARS] for _ in range(500)}
    assert len(firsts) == 500


def test_shared_prefix_round_holds_each_group_exactly_n_times() -> None:
    workload = SharedPrefix(
        groups=8, prompts_per_group=5, prefix_tokens=64, question_tokens=16, output_tokens=7
    )
    specs = take(workload, 8 * 5 * 2)
    for round_specs in (specs[:40], specs[40:]):
        assert Counter(s.group for s in round_specs) == {f"g{g}": 5 for g in range(8)}
    prefixes: dict[str, set[str]] = {}
    for spec in specs:
        (role0, system), (role1, question) = spec.messages
        assert (role0, role1) == ("system", "user")
        assert len(system) == 64 * 4 and len(question) == 16 * 4
        assert spec.max_tokens == 7
        prefixes.setdefault(spec.group or "", set()).add(system)
    assert all(len(texts) == 1 for texts in prefixes.values()), "one prefix per group"
    assert len({next(iter(t))[:BLOCK_CHARS] for t in prefixes.values()}) == 8, "groups differ at block 0"
    questions = [s.messages[1][1] for s in specs]
    assert len(set(questions)) == len(questions), "later rounds draw fresh questions"
    assert [s.group for s in specs[:40]] != sorted(s.group or "" for s in specs[:40]), "shuffled"


def test_multi_turn_threads_grow_turn_by_turn_with_a_session_each() -> None:
    workload = MultiTurn(active=3, turns=4, system_tokens=32, user_tokens=8, output_tokens=16)
    specs = take(workload, 3 * 4 * 2)
    by_session: dict[str, list[RequestSpec]] = {}
    for spec in specs:
        assert spec.session_id is not None and spec.group == spec.session_id
        by_session.setdefault(spec.session_id, []).append(spec)
    assert len(by_session) == 6, "a finished thread is replaced by a new one"
    for turns in by_session.values():
        assert len(turns) == 4
        for k, spec in enumerate(turns):
            roles = [role for role, _ in spec.messages]
            assert roles == ["system"] + ["user", "assistant"] * k + ["user"]
            if k:
                previous = turns[k - 1].messages
                assert spec.messages[: len(previous)] == previous, "each turn extends the last prompt"
                assert len(spec.messages[len(previous)][1]) == 16 * 4  # the assistant answer
    first_round = [s.session_id for s in specs[:3]]
    assert len(set(first_round)) == 3, "active threads take turns round-robin"


def test_zipf_prefixes_are_skewed_toward_the_hottest() -> None:
    workload = ZipfPrefixes(prefixes=50, exponent=1.1, prefix_tokens=32, question_tokens=8)
    counts = Counter(s.group for s in take(workload, 5000))
    assert counts["p0"] > counts["p1"] > counts["p9"]
    weights = [1 / (k + 1) ** 1.1 for k in range(50)]
    expected_hottest = 5000 * weights[0] / sum(weights)
    assert counts["p0"] == pytest.approx(expected_hottest, rel=0.1)
    systems = {s.group: s.messages[0][1] for s in take(workload, 500)}
    assert len(set(systems.values())) == len(systems), "one distinct prefix per rank"


def test_zipf_sampler_exponent_zero_is_uniform() -> None:
    counts = Counter(itertools.islice(zipf_sampler(random.Random(0), 4, 0.0), 8000))
    assert all(c == pytest.approx(2000, rel=0.08) for c in counts.values())


def test_no_sharing_prompts_are_unique_from_the_first_block() -> None:
    specs = take(NoSharing(prompt_tokens=100, output_tokens=9), 300)
    assert len({s.prompt_text()[:BLOCK_CHARS] for s in specs}) == 300
    assert all(s.prompt_tokens() == 100 and s.max_tokens == 9 for s in specs)


def test_long_context_mix_fraction_and_lengths() -> None:
    specs = take(LongContextMix(short_tokens=10, long_tokens=500, long_fraction=0.2), 4000)
    longs = [s for s in specs if s.group == "long"]
    assert len(longs) / len(specs) == pytest.approx(0.2, abs=0.03)
    assert {s.prompt_tokens() for s in specs} == {10, 500}


def test_build_workload_overrides_fields_and_rejects_unknown() -> None:
    workload = build_workload("shared-prefix", ["groups=3", "prefix-tokens=16"])
    assert isinstance(workload, SharedPrefix) and (workload.groups, workload.prefix_tokens) == (3, 16)
    assert build_workload("zipf", ["exponent=0.9"]).describe()["exponent"] == 0.9
    with pytest.raises(ValueError, match="known: groups"):
        build_workload("shared-prefix", ["colour=blue"])
    with pytest.raises(ValueError, match="unknown workload"):
        build_workload("nope")


def test_the_field_default_shared_prefix_preset() -> None:
    workload = build_workload("shared-prefix")
    assert workload.describe() == {
        "groups": 64,
        "prompts_per_group": 16,
        "prefix_tokens": 2048,
        "question_tokens": 128,
        "output_tokens": 256,
        "name": "shared-prefix",
    }


def test_priority_mix_is_seeded_and_sticky_per_session() -> None:
    mix = parse_priority_mix("critical=1, interactive=2,batch=1")
    assert mix == {"critical": 1.0, "interactive": 2.0, "batch": 1.0}
    specs = take(MultiTurn(active=4, turns=3, system_tokens=4, user_tokens=4, output_tokens=4), 60)
    first = list(with_priorities(iter(specs), mix, seed=1))
    assert first == list(with_priorities(iter(specs), mix, seed=1))
    assert [replace_priority(s) for s in first] == specs, "only the priority changes"
    by_session: dict[str, set[str | None]] = {}
    for spec in first:
        by_session.setdefault(spec.session_id or "", set()).add(spec.priority)
    assert all(len(p) == 1 for p in by_session.values())
    with pytest.raises(ValueError):
        parse_priority_mix("critical")


def replace_priority(spec: RequestSpec) -> RequestSpec:
    from dataclasses import replace

    return replace(spec, priority=None)


def test_request_body_and_headers() -> None:
    spec = RequestSpec(messages=(("user", "hi"),), max_tokens=3, session_id="s1", priority="batch")
    assert spec.body("m", stream=True) == {
        "model": "m",
        "max_tokens": 3,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "stream_options": {"include_usage": True},
    }
    assert "stream_options" not in spec.body("m", stream=False)
    assert spec.headers() == {"x-session-id": "s1", "x-gateway-priority": "batch"}
    completion = RequestSpec(prompt="once", max_tokens=2)
    assert completion.body("m", stream=False)["prompt"] == "once" and not completion.chat


def test_trace_round_trip_and_errors(tmp_path: Path) -> None:
    specs = take(MultiTurn(active=2, turns=2, system_tokens=4, user_tokens=4, output_tokens=4), 4)
    specs = [*specs, RequestSpec(prompt="plain", max_tokens=5, priority="batch", at_s=1.5)]
    path = tmp_path / "trace.jsonl"
    assert write_trace(path, specs) == 5
    assert read_trace(path) == specs
    replay = TraceWorkload(str(path))
    assert take(replay, 7)[5] == specs[0], "repeats from the top"
    assert replay.arrival_times_s() == (1.5,)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('# comment\n\n{"max_tokens": 3}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3"):
        read_trace(bad)


def test_multi_turn_order_does_not_pin_threads_under_round_robin() -> None:
    from itertools import islice

    from bench.generators import MultiTurn

    replicas_by_thread: dict[str, set[int]] = {}
    for i, spec in enumerate(islice(MultiTurn(active=32, turns=8).requests(seed=3), 32 * 6)):
        replicas_by_thread.setdefault(spec.session_id, set()).add(i % 4)
    assert sum(len(seen) > 1 for seen in replicas_by_thread.values()) > len(replicas_by_thread) // 2
