from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mock_engine.disagg_params import Protocol, Role
from mock_engine.faults import FaultSettings
from tests.disagg_fleet import disagg_engine
from tests.faults.traffic import MODEL
from tests.servers import ServerThread

MATRIX: dict[str, Counter[str]] = {}
TABLE_ENV = "LLM_GATEWAY_FAULT_TABLE"


@pytest.fixture(scope="session", autouse=True)
def fault_table() -> Iterator[dict[str, Counter[str]]]:
    """Collects fault × outcome counts; writes a markdown table to $LLM_GATEWAY_FAULT_TABLE if set."""
    yield MATRIX
    import os

    target = os.environ.get(TABLE_ENV)
    if target and MATRIX:
        kinds = sorted({k for counts in MATRIX.values() for k in counts})
        lines = ["| fault | " + " | ".join(kinds) + " |", "|---|" + "---:|" * len(kinds)]
        for fault, counts in MATRIX.items():
            lines.append(f"| {fault} | " + " | ".join(str(counts.get(k, 0)) for k in kinds) + " |")
        Path(target).write_text("\n".join(lines) + "\n")


DisaggEngines = Callable[..., ServerThread]


@pytest.fixture
def disagg_engines() -> Iterator[DisaggEngines]:
    """Starts mock engines serving `MODEL` in a disaggregated role (`role, protocol, faults=None,
    first_token_s=…, token_s=…`: `tests.disagg_fleet.disagg_engine`); stops those still up."""
    started: list[ServerThread] = []

    def factory(
        role: Role, protocol: Protocol, faults: FaultSettings | None = None, **timing: float
    ) -> ServerThread:
        server = disagg_engine(MODEL, role, protocol, faults, **timing)
        started.append(server)
        return server

    yield factory
    for server in started:
        if not server.server.should_exit:
            server.stop()
