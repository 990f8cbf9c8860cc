"""Fault schedules and poison: parsing, the poisoned requests, the schedule runner against a fake fleet,
pool overrides with dotted keys, and the `--preset` expansion."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import httpx
import pytest

from bench import cli
from bench.commands import _entries
from bench.compare_presets import FAULTS, expand
from bench.fault_runner import FaultRunner
from bench.faults import (
    DEFAULT_POISON_MARKER,
    FaultEvent,
    Poison,
    parse_fault,
    parse_offset_s,
    parse_schedule,
    with_poison,
)
from bench.fleet_config import merge_into
from bench.options import pool_overrides
from bench.runner import LoadPlan, run_load
from bench.workload import RequestSpec


@pytest.mark.parametrize(("text", "seconds"), [("10s", 10.0), ("2.5s", 2.5), ("500ms", 0.5), ("7", 7.0)])
def test_offsets(text: str, seconds: float) -> None:
    assert parse_offset_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["-1s", "soon", "infs", "nan", ""])
def test_bad_offsets(text: str) -> None:
    with pytest.raises(ValueError, match="offset"):
        parse_offset_s(text)


def test_each_action_parses() -> None:
    assert parse_fault("at=10s kill=0") == FaultEvent(10.0, "kill", 0)
    assert parse_fault("restart=2 at=1500ms") == FaultEvent(1.5, "restart", 2)
    assert parse_fault("at=3 clear=1") == FaultEvent(3.0, "clear", 1)
    event = parse_fault("at=5s replica=1 set=crash_after_tokens:20,crash_rate:0.3,retry_after_s:null")
    assert event == FaultEvent(
        5.0, "set", 1, (("crash_after_tokens", 20), ("crash_rate", 0.3), ("retry_after_s", None))
    )
    assert event.to_json()["changes"] == {"crash_after_tokens": 20, "crash_rate": 0.3, "retry_after_s": None}
    assert parse_fault("at=1s replica=0 set=poison_effect:crash").changes == (("poison_effect", "crash"),)


@pytest.mark.parametrize(
    "text",
    [
        "at=10s kill=0",
        "at=0.5s restart=1",
        "at=2s replica=1 set=crash_after_tokens:20,crash_rate:0.3",
        "at=2s replica=0 set=refuse_connections:true,refuse_for_s:1.5,poison_marker:null",
        "at=30s clear=2",
    ],
)
def test_describe_parses_back(text: str) -> None:
    event = parse_fault(text)
    assert parse_fault(event.describe()) == event


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kill=0", "needs at="),
        ("at=1s", "exactly one of"),
        ("at=1s kill=0 restart=0", "exactly one of"),
        ("at=1s set=crash_rate:0.5", "needs replica="),
        ("at=1s replica=1 kill=0", "drop replica="),
        ("at=1s kill=zero", "replica number"),
        ("at=1s kill=-1", ">= 0"),
        ("at=1s kill=0 when=now", "unknown key"),
        ("at=1s at=2s kill=0", "repeated"),
        ("at=1s kill", "KEY=VALUE"),
        ("at=1s replica=0 set=crash_rate:1.5", "crash_rate must be within"),
        ("at=1s replica=0 set=colour:red", "unknown fault field"),
        ("at=1s replica=0 set=crash_rate", "FIELD:VALUE"),
        ("at=1s replica=0 set=", "at least one"),
    ],
)
def test_bad_faults_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fault(text)


def test_schedule_is_in_time_order_and_checks_replicas() -> None:
    schedule = parse_schedule(["at=27s restart=0", "at=15s kill=0", "at=15s replica=1 set=jitter_ms:5"], 3)
    assert [(e.at_s, e.action) for e in schedule] == [(15.0, "kill"), (15.0, "set"), (27.0, "restart")]
    with pytest.raises(ValueError, match="replica 3 does not exist"):
        parse_schedule(["at=1s kill=3"], 3)


def test_poison_settings() -> None:
    poison = Poison(0.05, effect="crash")
    assert poison.engine_args() == ("--poison-marker", DEFAULT_POISON_MARKER, "--poison-effect", "crash")
    with pytest.raises(ValueError, match="within"):
        Poison(1.5)
    with pytest.raises(ValueError, match="poison-effect"):
        Poison(0.1, effect="explode")
    with pytest.raises(ValueError, match="marker"):
        Poison(0.1, marker="two words")


def _specs(n: int, completions: bool = False) -> Iterator[RequestSpec]:
    for i in range(n):
        if completions:
            yield RequestSpec(prompt=f"p{i}", max_tokens=4)
        else:
            yield RequestSpec(messages=(("system", "s"), ("user", f"q{i}")), max_tokens=4)


def test_poison_share_is_exact_per_block_and_skips_the_warmup() -> None:
    out = list(with_poison(_specs(1010), Poison(0.05), seed=1, skip=10))
    hits = [i for i, s in enumerate(out) if s.poisoned]
    assert len(hits) == 50 and min(hits) >= 10
    for block in range(10):
        assert sum(1 for i in hits if 10 + block * 100 <= i < 110 + block * 100) == 5
    again = [i for i, s in enumerate(with_poison(_specs(1010), Poison(0.05), seed=1, skip=10)) if s.poisoned]
    assert again == hits, "the same seed poisons the same requests"
    other = [i for i, s in enumerate(with_poison(_specs(1010), Poison(0.05), seed=2, skip=10)) if s.poisoned]
    assert other != hits
    first = out[hits[0]]
    assert first.messages == (("system", "s"), ("user", f"q{hits[0]} {DEFAULT_POISON_MARKER}"))
    assert not any(DEFAULT_POISON_MARKER in s.prompt_text() for s in out if not s.poisoned)


def test_poison_fraction_below_one_per_block_carries_over() -> None:
    hits = sum(s.poisoned for s in with_poison(_specs(1000), Poison(0.005), seed=3))
    assert hits == 5
    completions = list(with_poison(_specs(200, completions=True), Poison(0.5, marker="XX"), seed=3))
    assert sum(s.poisoned for s in completions) == 100
    assert all(s.prompt is not None and s.prompt.endswith(" XX") for s in completions if s.poisoned)
    assert list(with_poison(_specs(3), None, seed=3)) == list(_specs(3))


class FakeFleet:
    def __init__(self) -> None:
        self.engine_urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
        self.calls: list[str] = []
        self.up = [True, True]

    def kill_engine(self, replica: int) -> int | None:
        self.calls.append(f"kill {replica}")
        was_up, self.up[replica] = self.up[replica], False
        return 100 + replica if was_up else None

    def spawn_engine(self, replica: int) -> int:
        self.calls.append(f"spawn {replica}")
        self.up[replica] = True
        return 200 + replica


async def test_fault_runner_runs_the_schedule_and_skips_what_the_run_did_not_reach() -> None:
    fleet = FakeFleet()
    seen: list[str] = []
    health_answers = itertools.chain([503, 503], itertools.repeat(200))

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url}")
        if request.url.path == "/health":
            port = request.url.port
            return httpx.Response(next(health_answers) if port == 1 else 500)
        if request.method == "POST":
            return httpx.Response(400 if b"bad" in request.content else 200, text="{}")
        return httpx.Response(200)

    schedule = parse_schedule(
        [
            "at=0s kill=0",
            "at=0s kill=0",
            "at=10ms replica=1 set=crash_rate:0.5",
            "at=20ms restart=0",
            "at=30ms replica=1 set=poison_marker:bad",
            "at=40ms restart=1",
            "at=60s clear=1",
        ],
        2,
    )
    runner = FaultRunner(schedule, fleet, ready_timeout_s=0.3, transport=httpx.MockTransport(handler))
    runner.start(origin_s=2.0)
    await asyncio.sleep(0.6)
    log = await runner.stop()
    assert [e["status"] for e in log] == ["done", "done", "done", "done", "failed", "failed", "skipped"]
    assert log[0]["detail"] == "SIGKILL pid 100" and log[1]["detail"] == "was not running"
    assert log[2]["detail"] == "/mock/faults 200" and log[2]["replica_id"] == "127.0.0.1:2"
    assert log[3]["ready_at_s"] is not None and log[3]["ready_at_s"] > log[3]["ran_at_s"]
    assert log[3]["ready_at_run_s"] == pytest.approx(2.0 + log[3]["ready_at_s"])
    assert "pid 200 on the same port" in log[3]["detail"]
    assert "answered 400" in log[4]["detail"]
    assert "TimeoutError" in log[5]["detail"], "engine 1's /health never answered 200"
    assert log[6]["ran_at_s"] is None and log[6]["fault"] == "at=60s clear=1"
    assert fleet.calls == ["kill 0", "kill 0", "spawn 0", "spawn 1"]
    assert "POST http://127.0.0.1:2/mock/faults" in seen


async def test_a_restart_cut_short_by_the_end_of_the_run_is_interrupted() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(503))
    runner = FaultRunner(parse_schedule(["at=0s restart=0"], 1), FakeFleet(), transport=transport)
    runner.start(origin_s=0.0)
    await asyncio.sleep(0.1)
    (entry,) = await runner.stop()
    assert entry["status"] == "interrupted" and entry["ready_at_s"] is None


async def test_the_runner_reports_the_start_of_the_measured_window_once() -> None:
    async def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"usage": {"completion_tokens": 1}})

    from bench.arrivals import Constant
    from bench.client import BenchClient, ClientOptions

    client = BenchClient(ClientOptions(model="m", stream=False), transport=httpx.MockTransport(answer))
    starts: list[float] = []
    plan = LoadPlan(Constant(500.0), requests=10, warmup_requests=4)
    await run_load(plan, _specs(10), client, lambda s: "http://x", on_measured=starts.append)
    await client.aclose()
    assert len(starts) == 1 and starts[0] >= 4 / 500.0 - 1e-3


def test_pool_overrides_with_dotted_keys_merge() -> None:
    overrides = pool_overrides(
        ["breaker={consecutive_failures: 3}", "breaker.open_s=2", "continuation.enabled=false", "policy=x"]
    )
    assert overrides == {
        "breaker": {"consecutive_failures": 3, "open_s": 2},
        "continuation": {"enabled": False},
        "policy": "x",
    }
    with pytest.raises(ValueError, match="is not KEY=YAML"):
        pool_overrides(["breaker..open_s=2"])
    with pytest.raises(ValueError, match="used as a mapping"):
        pool_overrides(["policy=x", "policy.name=y"])
    pool = {"continuation": {"max_resumes": 2}, "policy": "a"}
    merge_into(pool, {"continuation": {"enabled": False}, "policy": "b"})
    assert pool == {"continuation": {"max_resumes": 2, "enabled": False}, "policy": "b"}


def test_preset_goes_in_front_and_own_options_replace_its_lists() -> None:
    assert expand(["--rate", "3"]) == ["--rate", "3"]
    argv = expand(["--preset", "faults", "--rate", "3"])
    assert argv[: len(FAULTS)] == list(FAULTS) and argv[-2:] == ["--rate", "3"]
    own = expand(["--preset=faults", "--fault", "at=1s kill=1", "--variant", "a:", "--pool-set", "x=1"])
    assert own.count("--fault") == 1 and own.count("--variant") == 1
    assert own.count("--pool-set") == FAULTS.count("--pool-set") + 1, "pool settings add up"
    with pytest.raises(SystemExit, match="unknown --preset"):
        expand(["--preset", "nope"])


def test_compare_preset_through_the_command_line_parser() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["compare", "--rate", "3", "--preset", "faults", "--variant", "only:"])
    assert args.rate == [3.0] and args.replicas == 3 and args.poison_fraction == 0.05
    assert args.variant == ["only:"] and len(args.fault) == 3
    full = parser.parse_args(["compare", "--preset", "faults"])
    labels = [label for label, _, _ in _entries(full)]
    assert labels == ["contained", "no-continuation", "breaker-as-was", "neither"]
    neither = _entries(full)[3][1]
    assert neither is not None
    assert neither.pool_overrides["continuation"] == {"enabled": False}
    assert neither.pool_overrides["attribution"] == {"enabled": False}
    assert neither.pool_overrides["timeouts"] == {"ttft_s": 1, "idle_s": 1}
    contained = _entries(full)[0][1]
    assert contained is not None and "continuation" not in contained.pool_overrides
    run = parser.parse_args(["run", "--fault", "at=1s kill=0"])
    assert run.fault == ["at=1s kill=0"] and not hasattr(run, "preset")
    twice = parser.parse_args(["compare", "--variant", "a:", "--variant", "a:policy=x"])
    with pytest.raises(ValueError, match="distinct labels"):
        _entries(twice)
