"""Metric children resolved once: `Children(family)(*labels)` is `family.labels(*labels)`, looked up the
first time and kept, so the serve path pays a dictionary read per observation instead of the label
resolution (validation, a lock, a tuple) per request. For families whose label values are few and
long-lived — pools, outcomes, reasons, policies, tenants; never request ids (`gateway.base.metrics`).
"""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)


class Children(Generic[M]):
    """A metric family's children by label values, each resolved on its first use and kept."""

    __slots__ = ("_by_labels", "_family")

    def __init__(self, family: M) -> None:
        self._family = family
        self._by_labels: dict[tuple[str, ...], M] = {}

    def __call__(self, *labels: str) -> M:
        child = self._by_labels.get(labels)
        if child is None:
            child = self._by_labels[labels] = self._family.labels(*labels)
        return child
