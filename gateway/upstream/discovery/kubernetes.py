"""Kubernetes discovery: list-then-watch of discovery.k8s.io/v1 EndpointSlices over httpx.

The loop is the informer pattern, kept small:
1. **list** (a consistent read, paginated) → replace the whole slice map → emit one `ReplicaSet`;
2. **watch** from the list's `resourceVersion` with `allowWatchBookmarks` and a server-side
   `timeoutSeconds`; every ADDED/MODIFIED/DELETED updates one slice and emits when the set changed;
   BOOKMARK only advances the resourceVersion;
3. a watch that ends normally (server timeout) is resumed at once from the last resourceVersion;
   a dropped or failed one is resumed after exponential backoff with jitter; **410 Gone** (as a status or
   as an ERROR event) means the resourceVersion expired: re-list — a re-list *replaces* the state, so
   slices deleted while we were away disappear (resuming a watch without one would keep them forever).

Staleness bound: while the API cannot be reached the last known set stays as it is, but once the view
has not been confirmed for `max_stale_s` every known endpoint is emitted as `draining` (no new
requests, in-flight finish; clients get 503 `no_replica` with Retry-After) and the next successful
contact is a fresh list. Blind routing to addresses that may since have been reused by other pods is
worse than a loud, bounded outage; `max_stale_s: null` opts into keeping the last set (kube-proxy's
behaviour) for clusters where the control plane is known to disappear for long maintenance windows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Mapping
from typing import Any

import httpx

from core.clock import Clock, SystemClock
from gateway.config.discovery_settings import KubernetesReplicas
from gateway.upstream.discovery.endpointslices import SliceStates, merge_slices, slice_states
from gateway.upstream.discovery.k8s_answers import (
    ApiError,
    MalformedResponse,
    ResourceExpired,
    json_body,
    status_message,
)
from gateway.upstream.discovery.k8s_auth import ApiAccess, namespace_for, resolve_access
from gateway.upstream.discovery.types import Emitter, OnChange, ReplicaSet

logger = logging.getLogger(__name__)

READ_SLACK_S = 10.0
LIST_PAGE_SIZE = 500


class KubernetesEndpointSliceDiscovery:
    """EndpointSlices of one Service (or label selector) → `ReplicaSet` events (module docstring)."""

    def __init__(
        self,
        namespace: str,
        label_selector: str,
        port: int | str | None,
        *,
        on_change: OnChange,
        access: ApiAccess,
        scheme: str = "http",
        watch_timeout_s: int = 60,
        request_timeout_s: float = 10.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        max_stale_s: float | None = 300.0,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.namespace = namespace
        self.label_selector = label_selector
        self.port = port
        self.scheme = scheme
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.max_stale_s = max_stale_s
        self._access = access
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._emitter = Emitter(on_change)
        self._slices: dict[str, SliceStates] = {}
        self._resource_version: str | None = None
        self._failures = 0
        self._expired_in_a_row = 0
        self._last_confirmed_s = self._clock.now_s()
        self._stale_drained = False
        self.lists_total = 0
        self.watches_total = 0
        self.errors_total = 0
        self.last_error: str | None = None

    @classmethod
    def from_settings(
        cls, settings: KubernetesReplicas, on_change: OnChange, environ: Mapping[str, str] | None = None
    ) -> KubernetesEndpointSliceDiscovery:
        access = resolve_access(settings, environ)
        return cls(
            namespace_for(settings, access),
            settings.label_selector(),
            settings.port,
            on_change=on_change,
            access=access,
            scheme=settings.scheme,
            watch_timeout_s=settings.watch_timeout_s,
            request_timeout_s=settings.request_timeout_s,
            backoff_initial_s=settings.backoff_initial_s,
            backoff_max_s=settings.backoff_max_s,
            max_stale_s=settings.max_stale_s,
        )

    @property
    def current(self) -> ReplicaSet | None:
        return self._emitter.last

    @property
    def resource_version(self) -> str | None:
        return self._resource_version

    @property
    def _path(self) -> str:
        return f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"

    async def run(self) -> None:
        """List, then watch, forever (until cancelled)."""
        timeout = httpx.Timeout(self.request_timeout_s, read=self.watch_timeout_s + READ_SLACK_S)
        async with httpx.AsyncClient(
            base_url=self._access.base_url, verify=self._access.verify, timeout=timeout, trust_env=False
        ) as client:
            while True:
                await self._cycle(client)

    async def _cycle(self, client: httpx.AsyncClient) -> None:
        try:
            if self._resource_version is None:
                await self._list(client)
            if await self._watch(client):
                self._failures = 0
                self._expired_in_a_row = 0
                return
            self._record_failure("watch ended at once without events")
        except ResourceExpired as exc:
            self._resource_version = None
            self._expired_in_a_row += 1
            if self._expired_in_a_row == 1:
                logger.info("kubernetes discovery %s: %s; re-listing", self.label_selector, exc)
                return  # re-list at once; a second 410 in a row backs off like any failure
            self._record_failure(f"{exc} again")
        except (httpx.HTTPError, ApiError) as exc:
            # Only API and transport failures: an exception from `on_change` (the registry) propagates.
            self._record_failure(f"{type(exc).__name__}: {exc}")
        await self._backoff()

    def _record_failure(self, message: str) -> None:
        self.errors_total += 1
        self._failures += 1
        self.last_error = message
        log = logger.warning if self._failures == 1 else logger.debug
        log("kubernetes discovery %s: %s (failure %d)", self.label_selector, message, self._failures)

    async def _backoff(self) -> None:
        delay_s = min(self.backoff_max_s, self.backoff_initial_s * 2 ** max(0, self._failures - 1))
        delay_s *= self._rng.uniform(0.5, 1.0)
        if self.max_stale_s is not None and not self._stale_drained:
            until_stale_s = self._last_confirmed_s + self.max_stale_s - self._clock.now_s()
            delay_s = max(0.0, min(delay_s, until_stale_s))
        await asyncio.sleep(delay_s)
        self._check_stale()

    def _check_stale(self) -> None:
        if self.max_stale_s is None or self._stale_drained:
            return
        if self._clock.now_s() - self._last_confirmed_s < self.max_stale_s:
            return
        self._stale_drained = True
        self._resource_version = None  # recover with a fresh list, never by resuming an old watch
        last = self._emitter.last
        logger.error(
            "kubernetes discovery %s: API unreachable for %.0f s; draining %d endpoint(s) until it answers",
            self.label_selector,
            self.max_stale_s,
            len(last or ()),
        )
        if last is not None:
            self._emitter.emit(last.all_draining())

    def _confirmed(self) -> None:
        self._last_confirmed_s = self._clock.now_s()
        self._stale_drained = False

    def _emit(self) -> None:
        self._emitter.emit(merge_slices(self._slices.values()))

    async def _list(self, client: httpx.AsyncClient) -> None:
        slices: dict[str, SliceStates] = {}
        params: dict[str, str | int] = {"labelSelector": self.label_selector, "limit": LIST_PAGE_SIZE}
        while True:
            response = await client.get(
                self._path, params=params, headers=self._access.headers(), timeout=self.request_timeout_s
            )
            body = json_body(response)
            if response.status_code != 200:
                raise ApiError(response.status_code, f"list endpointslices: {status_message(body)}")
            version, next_page = self._parse_page(body, slices)
            if not next_page:
                break
            params["continue"] = next_page
        self.lists_total += 1
        self._slices = slices
        self._resource_version = version
        self._confirmed()
        self._emit()

    def _parse_page(self, body: Mapping[str, Any], into: dict[str, SliceStates]) -> tuple[str, str | None]:
        """Add one list page's slices to `into`; (resourceVersion, continue token)."""
        try:
            for item in body.get("items") or []:
                into[item["metadata"]["name"]] = slice_states(item, self.port, self.scheme)
            metadata = body["metadata"]
            return str(metadata["resourceVersion"]), metadata.get("continue") or None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise MalformedResponse(200, f"list endpointslices: {type(exc).__name__}: {exc}") from None

    async def _watch(self, client: httpx.AsyncClient) -> bool:
        """One watch request; True when it ended normally after doing useful work."""
        params: dict[str, str | int] = {
            "labelSelector": self.label_selector,
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": self.watch_timeout_s,
            "resourceVersion": self._resource_version or "",
        }
        started_s = self._clock.now_s()
        events = 0
        headers = self._access.headers()
        async with client.stream("GET", self._path, params=params, headers=headers) as response:
            if response.status_code != 200:
                body = json_body(response, await response.aread())
                error = ResourceExpired if response.status_code == 410 else ApiError
                raise error(response.status_code, f"watch endpointslices: {status_message(body)}")
            self.watches_total += 1
            self._confirmed()
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                changed = self._apply_event(line)
                if events == 0:  # useful work: the next failure starts the backoff afresh
                    self._failures = self._expired_in_a_row = 0
                events += 1
                self._confirmed()
                if changed:
                    self._emit()
        return events > 0 or self._clock.now_s() - started_s >= self.watch_timeout_s / 2

    def _apply_event(self, line: str) -> bool:
        """Apply one watch event to the slice map; True when a slice changed (emit afterwards)."""
        try:
            event = json.loads(line)
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                code = int(obj.get("code") or 500)
                error = ResourceExpired if code == 410 else ApiError
                raise error(code, f"watch event: {status_message(obj)}")
            metadata = obj.get("metadata") or {}
            if metadata.get("resourceVersion"):
                self._resource_version = str(metadata["resourceVersion"])
            if kind == "BOOKMARK":
                return False
            name = metadata["name"]
            if kind == "DELETED":
                self._slices.pop(name, None)
            elif kind in ("ADDED", "MODIFIED"):
                self._slices[name] = slice_states(obj, self.port, self.scheme)
            else:
                raise MalformedResponse(200, f"unknown watch event type {kind!r}")
            return True
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise MalformedResponse(200, f"watch event: {type(exc).__name__}: {exc}") from None
