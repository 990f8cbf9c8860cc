"""A fake Kubernetes API server on 127.0.0.1 for EndpointSlice list and watch (asyncio streams).

One request per connection (`Connection: close`). It keeps the slices, a resourceVersion counter and the
event history so a watch resumes from any resourceVersion it still has; `compact()` forgets the history
(a later watch from an old version answers 410 Gone, as etcd compaction does). Every request is
recorded so tests can assert what the client sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

NAMESPACE = "ml"
SERVICE = "vllm"
_PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"

_DROP = object()
_END = object()


def endpoint(
    ip: str, ready: bool | None = True, serving: bool | None = None, terminating: bool | None = None
) -> dict[str, Any]:
    conditions = {k: v for k, v in (("ready", ready), ("serving", serving), ("terminating", terminating))}
    return {
        "addresses": [ip],
        "conditions": {k: v for k, v in conditions.items() if v is not None},
        "targetRef": {"kind": "Pod", "name": f"pod-{ip}"},
    }


def endpoint_slice(name: str, endpoints: list[dict[str, Any]], port: int = 8000) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"kubernetes.io/service-name": SERVICE}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    }


@dataclass
class Recorded:
    path: str
    params: dict[str, str]
    headers: dict[str, str]

    @property
    def is_watch(self) -> bool:
        return self.params.get("watch") in ("true", "1")


@dataclass
class FakeApiServer:
    ssl_context: ssl.SSLContext | None = None
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    down: bool = False
    """While true every connection is closed without an answer (the API is unreachable)."""
    list_status: int = 200
    resource_version: int = 100
    _history: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    _compacted_at: int = 0
    _watchers: set[asyncio.Queue[object]] = field(default_factory=set)
    _server: asyncio.Server | None = None
    port: int = 0

    async def start(self) -> FakeApiServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        await self.drop_watches()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    # -- state changes (each one an event for the open watches) ------------------------------------

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.resource_version += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        return obj

    def _publish(self, event: dict[str, Any]) -> None:
        self._history.append((self.resource_version, event))
        for queue in self._watchers:
            queue.put_nowait(event)

    def upsert(self, obj: dict[str, Any]) -> None:
        kind = "MODIFIED" if obj["metadata"]["name"] in self.slices else "ADDED"
        obj = self._bump(obj)
        self.slices[obj["metadata"]["name"]] = obj
        self._publish({"type": kind, "object": obj})

    def delete(self, name: str) -> None:
        obj = self._bump(self.slices.pop(name))
        self._publish({"type": "DELETED", "object": obj})

    def bookmark(self) -> None:
        self.resource_version += 1
        obj = {"kind": "EndpointSlice", "metadata": {"resourceVersion": str(self.resource_version)}}
        for queue in self._watchers:
            queue.put_nowait({"type": "BOOKMARK", "object": obj})

    def send_gone(self) -> None:
        status = {
            "kind": "Status",
            "status": "Failure",
            "code": 410,
            "reason": "Expired",
            "message": "too old resource version",
        }
        for queue in self._watchers:
            queue.put_nowait({"type": "ERROR", "object": status})

    def send_raw(self, line: bytes) -> None:
        """A line that is not a watch event (a broken proxy, a bug): the client must not trust it."""
        for queue in self._watchers:
            queue.put_nowait(line)

    def compact(self) -> None:
        self._compacted_at = self.resource_version
        self._history.clear()

    async def drop_watches(self, graceful: bool = False) -> None:
        for queue in self._watchers:
            queue.put_nowait(_END if graceful else _DROP)
        await asyncio.sleep(0)

    @property
    def watch_count(self) -> int:
        return len(self._watchers)

    def lists(self) -> list[Recorded]:
        return [r for r in self.requests if not r.is_watch]

    def watches(self) -> list[Recorded]:
        return [r for r in self.requests if r.is_watch]

    # -- HTTP ---------------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if self.down:
                return
            request = _parse(head)
            self.requests.append(request)
            if request.path != _PATH:
                await _respond(writer, 404, {"kind": "Status", "code": 404, "message": "not found"})
            elif request.is_watch:
                await self._watch(request, reader, writer)
            elif self.list_status != 200:
                await _respond(
                    writer,
                    self.list_status,
                    {"kind": "Status", "code": self.list_status, "message": "forbidden by the test"},
                )
            else:
                await _respond(writer, 200, self._list_body())
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _list_body(self) -> dict[str, Any]:
        return {
            "kind": "EndpointSliceList",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"resourceVersion": str(self.resource_version)},
            "items": list(self.slices.values()),
        }

    async def _watch(
        self, request: Recorded, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        since = int(request.params.get("resourceVersion") or self.resource_version)
        if since < self._compacted_at:
            await _respond(
                writer,
                410,
                {
                    "kind": "Status",
                    "code": 410,
                    "reason": "Expired",
                    "message": f"too old resource version: {since}",
                },
            )
            return
        queue: asyncio.Queue[object] = asyncio.Queue()
        for rv, event in self._history:
            if rv > since:
                queue.put_nowait(event)
        self._watchers.add(queue)
        closed_by_client = asyncio.create_task(_put_on_eof(reader, queue))
        try:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            )
            await writer.drain()
            while True:
                item = await queue.get()
                if item is _DROP:
                    writer.transport.abort()
                    return
                if item is _END:
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    return
                data = item if isinstance(item, bytes) else json.dumps(item).encode() + b"\n"
                writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                await writer.drain()
                if isinstance(item, dict) and item.get("type") == "ERROR":
                    queue.put_nowait(_END)  # the API server ends a watch after an ERROR event
        finally:
            self._watchers.discard(queue)
            closed_by_client.cancel()


async def _put_on_eof(reader: asyncio.StreamReader, queue: asyncio.Queue[object]) -> None:
    with contextlib.suppress(ConnectionError):
        await reader.read()
    queue.put_nowait(_DROP)


def _parse(head: bytes) -> Recorded:
    lines = head.decode("latin-1").split("\r\n")
    _method, target, _version = lines[0].split(" ", 2)
    parts = urlsplit(target)
    params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return Recorded(parts.path, params, headers)


async def _respond(writer: asyncio.StreamWriter, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    writer.write(
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        f"Connection: close\r\n\r\n".encode()
        + data
    )
    await writer.drain()
