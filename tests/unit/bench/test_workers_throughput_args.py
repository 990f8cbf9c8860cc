"""`bench.workers_throughput --gateways`: WORKERS:STATE pairs, refused by name otherwise."""

from __future__ import annotations

import pytest

from bench.workers_throughput import gateway_list


def test_pairs_in_order() -> None:
    assert gateway_list("1:memory,2:memory,2:redis") == [(1, "memory"), (2, "memory"), (2, "redis")]


@pytest.mark.parametrize("text", ["2", "2:disk", "0:memory", "x:redis", ""])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        gateway_list(text)
