from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

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
