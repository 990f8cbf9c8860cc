"""The fuzz suite's servers, started once per module (see `fleet.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fuzz.fleet import Fleet, start_fleet


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    yield from start_fleet()
